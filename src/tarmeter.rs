//! What an untrusted tar stream may hold besides its members' data: headers and padding, GNU
//! long names, pax records, the data of entries the reader skips. The `tar` crate reads a long
//! name or a pax record whole into memory, and decompresses skipped data to throw it away;
//! neither is file data, so a cap on what is written does not bound them. [`Metered`] does:
//! between two entries the stream may give at most [`WINDOW`] such bytes (node-tar, npm's,
//! takes a metadata entry of up to 1 MiB), and at most [`BASE`] plus [`PER_ENTRY`] an entry
//! in all. The reader of the entries tells the [`Meter`] of each entry and of the data it is
//! about to read.

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
    /// Bytes the stream gave.
    read: Cell<u64>,
    /// File data announced by [`Meter::data`].
    data: Cell<u64>,
    entries: Cell<u64>,
    /// What was not file data when the last entry began.
    window_start: Cell<u64>,
}

impl State {
    fn other(&self) -> u64 {
        self.read.get().saturating_sub(self.data.get())
    }
}

/// A tar stream, failing once it has given more than its [`Meter`] allows besides file data.
pub struct Metered<R> {
    inner: R,
    state: Rc<State>,
}

/// Tells a [`Metered`] stream where its entries begin and how much file data they hold.
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
        s.window_start.set(s.other());
    }

    /// The current entry's `bytes` of file data will be read (as they are in the stream: a
    /// sparse file's stored data, not its holes).
    pub fn data(&self, bytes: u64) {
        let s = &self.0;
        s.data.set(s.data.get().saturating_add(bytes));
    }
}

impl<R: Read> Read for Metered<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        let s = &self.state;
        s.read.set(s.read.get() + n as u64);
        let other = s.other();
        let total = BASE.saturating_add(PER_ENTRY.saturating_mul(s.entries.get()));
        if other - s.window_start.get().min(other) > WINDOW || other > total {
            return Err(io::Error::other(format!(
                "the archive holds more than its files allow besides their data: over {} MiB \
                 for one entry's headers, long names and pax records, or over {} MiB plus \
                 {} KiB an entry in all (entries that are skipped count too)",
                WINDOW >> 20,
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
                meter.data(entry.size());
                files += io::copy(&mut entry, &mut io::sink())?;
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
            assert!(
                err.to_string().contains("over 16 MiB for one entry"),
                "{err}"
            );
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
    }
}
