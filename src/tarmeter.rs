//! What an untrusted tar stream may hold besides its members' data: headers and padding, GNU
//! long names, pax records, the data of entries the reader skips. The `tar` crate reads a long
//! name or a pax record whole into memory, and decompresses skipped data to throw it away;
//! neither is file data, so a cap on what is written does not bound them. [`Metered`] does:
//! between two entries the stream may give at most [`WINDOW`] such bytes (node-tar, npm's,
//! takes a metadata entry of up to 1 MiB), and at most [`BASE`] plus [`PER_ENTRY`] an entry
//! in all. The reader of the entries tells the [`Meter`] where each entry begins and when
//! it reads a file's data.

use std::cell::Cell;
use std::io::{self, Read};
use std::rc::Rc;

/// What one entry's metadata (and the previous entry's padding and skipped data) may take.
pub const WINDOW: u64 = 16 << 20;

/// What a whole stream may hold besides file data, before [`PER_ENTRY`] an entry.
pub const BASE: u64 = 16 << 20;

/// Besides file data, per entry: a header, a pax header and its records, their padding.
pub const PER_ENTRY: u64 = 4 << 10;

#[derive(Default)]
struct State {
    /// Bytes the stream gave while no file's data was being read.
    other: Cell<u64>,
    /// Whether a file's data is being read ([`Meter::reading`]).
    reading: Cell<bool>,
    entries: Cell<u64>,
    /// `other` when the last entry began.
    window_start: Cell<u64>,
}

/// A tar stream, failing once it has given more than its [`Meter`] allows besides file data.
pub struct Metered<R> {
    inner: R,
    state: Rc<State>,
}

/// Tells a [`Metered`] stream where its entries begin and when file data is read.
pub struct Meter(Rc<State>);

/// `inner`, metered, and the meter to tell it of the entries.
pub fn metered<R: Read>(inner: R) -> (Metered<R>, Meter) {
    let state = Rc::new(State::default());
    (
        Metered {
            inner,
            state: state.clone(),
        },
        Meter(state),
    )
}

impl Meter {
    /// An entry was read: its metadata window begins.
    pub fn entry(&self) {
        let s = &self.0;
        s.entries.set(s.entries.get() + 1);
        s.window_start.set(s.other.get());
    }

    /// Runs `read`, which reads the current entry's file data: what the stream gives
    /// meanwhile is not counted. (The tar reader gives an entry exactly its stored bytes, so
    /// nothing else can be read as data.)
    pub fn reading<T>(&self, read: impl FnOnce() -> T) -> T {
        self.0.reading.set(true);
        let out = read();
        self.0.reading.set(false);
        out
    }
}

impl<R: Read> Read for Metered<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        let s = &self.state;
        if s.reading.get() {
            return Ok(n);
        }
        let other = s.other.get() + n as u64;
        s.other.set(other);
        let entries = s.entries.get();
        if other - s.window_start.get() > WINDOW {
            return Err(io::Error::other(format!(
                "the archive holds more than {} MiB of headers, long names, pax records or \
                 skipped data after its entry {entries}, which the tar reader would hold in \
                 memory or decompress for nothing; no option raises this: the archive is \
                 malformed or hostile",
                WINDOW >> 20
            )));
        }
        if other > BASE.saturating_add(PER_ENTRY.saturating_mul(entries)) {
            return Err(io::Error::other(format!(
                "the archive holds more than {} MiB plus {} KiB an entry ({entries} so far) of \
                 headers, long names, pax records and skipped data; no option raises this: \
                 the archive is malformed or hostile",
                BASE >> 20,
                PER_ENTRY >> 10
            )));
        }
        Ok(n)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// A tar of `members` (name, type, data), read entry by entry as kiln's readers do: the
    /// data of regular files announced and read, the rest skipped.
    fn read_all(members: &[(&str, tar::EntryType, &[u8])]) -> io::Result<u64> {
        let mut tar = tar::Builder::new(Vec::new());
        for (name, kind, data) in members {
            let mut h = tar::Header::new_gnu();
            h.set_entry_type(*kind);
            h.set_size(data.len() as u64);
            h.set_mode(0o644);
            let raw = &mut h.as_old_mut().name;
            raw[..name.len()].copy_from_slice(name.as_bytes());
            h.set_cksum();
            tar.append(&h, *data).unwrap();
        }
        let bytes = tar.into_inner().unwrap();
        let (stream, meter) = metered(&bytes[..]);
        let mut archive = tar::Archive::new(stream);
        let mut files = 0;
        for entry in archive.entries()? {
            let mut entry = entry?;
            meter.entry();
            if entry.header().entry_type().is_file() {
                files += meter.reading(|| io::copy(&mut entry, &mut io::sink()))?;
            }
        }
        Ok(files)
    }

    #[test]
    fn files_of_any_size_pass_and_metadata_past_its_window_fails() {
        use tar::EntryType::{Fifo, GNULongName, Regular};
        let big = vec![b'a'; 20 << 20];
        assert_eq!(
            read_all(&[("a", Regular, &big), ("b", Regular, b"x")]).unwrap(),
            (20 << 20) + 1
        );
        for bomb in [
            ("pipe", Fifo, &big[..]),
            ("././@LongLink", GNULongName, &big),
        ] {
            let err = read_all(&[("a", Regular, b"x"), bomb, ("b", Regular, b"y")]).unwrap_err();
            assert!(err.to_string().contains("16 MiB of headers"), "{err}");
        }
    }

    #[test]
    fn skipped_data_within_each_window_still_counts_in_all() {
        use tar::EntryType::{Fifo, Regular};
        // 40,000 headers: 20 MiB, within their allowance.
        let names: Vec<String> = (0..40_000).map(|i| format!("f{i}")).collect();
        let many: Vec<_> = names
            .iter()
            .map(|n| (n.as_str(), Regular, &b""[..]))
            .collect();
        assert_eq!(read_all(&many).unwrap(), 0);
        // 5,000 entries skipping 8 KiB each: 45 MiB, past 16 MiB + 5,000 × 4 KiB.
        let junk = vec![0u8; 8 << 10];
        let pipes: Vec<_> = names[..5000]
            .iter()
            .map(|n| (n.as_str(), Fifo, &junk[..]))
            .collect();
        let err = read_all(&pipes).unwrap_err();
        assert!(err.to_string().contains("plus 4 KiB an entry"), "{err}");
        // 10,000 empty entries earn 40 MiB, yet one entry may not take 20 MiB of them.
        let big = vec![b'a'; 20 << 20];
        let mut then_bomb = many[..10_000].to_vec();
        then_bomb.push(("././@LongLink", tar::EntryType::GNULongName, &big[..]));
        then_bomb.push(("last", Regular, b"x"));
        let err = read_all(&then_bomb).unwrap_err();
        assert!(
            err.to_string().contains(
                "16 MiB of headers, long names, pax records or skipped data after its entry 10000"
            ),
            "{err}"
        );
    }
}
