//! Helpers shared by unit tests in more than one module (test builds only). Any module may
//! use them.

/// A wheel file of `members` (name, bytes, mode).
pub fn wheel(members: &[(&str, &[u8], u32)]) -> tempfile::NamedTempFile {
    let file = tempfile::NamedTempFile::new().unwrap();
    let mut zip = zip::ZipWriter::new(file.reopen().unwrap());
    for (name, bytes, mode) in members {
        let options = zip::write::SimpleFileOptions::default().unix_permissions(*mode);
        zip.start_file(*name, options).unwrap();
        std::io::Write::write_all(&mut zip, bytes).unwrap();
    }
    zip.finish().unwrap();
    file
}
