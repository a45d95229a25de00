//! What a tree of entries may cost on disk: the one rule for an image's layers unpacked by
//! `kiln run`, the install output kiln layers, and the trees its own installs build. Every
//! entry (file, directory, link, whiteout) costs [`ENTRY_COST`] bytes besides its contents,
//! for its inode, directory entry and metadata, and there may be at most so many of them:
//! without that, a small archive of empty directories or links fills a disk's inodes at no
//! cost against a byte cap.

/// What an entry costs of the byte budget besides its contents.
pub const ENTRY_COST: u64 = 512;

/// The most entries a tree may hold unless told otherwise.
pub const MAX_ENTRIES: u64 = 1_000_000;

/// The most bytes (contents and [`ENTRY_COST`]s) unless told otherwise: what `kiln run`
/// unpacks of a whole image by default.
pub const DEFAULT_BYTES: u64 = 8 << 30;

/// A cap as people write it: `8 GiB`, `4 MiB`, else bytes.
pub fn size_text(bytes: u64) -> String {
    match bytes {
        b if b >= 1 << 30 && b % (1 << 30) == 0 => format!("{} GiB", b >> 30),
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{} MiB", b >> 20),
        b => format!("{b} bytes"),
    }
}

/// Which cap an entry passed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Over {
    /// The bytes, with this limit.
    Bytes(u64),
    /// The number of entries, with this limit.
    Entries(u64),
}

/// What is left of a byte cap and an entry cap.
#[derive(Clone, Debug)]
pub struct Budget {
    bytes_left: u64,
    byte_limit: u64,
    entries_left: u64,
    entry_limit: u64,
}

impl Default for Budget {
    fn default() -> Self {
        Budget::new(DEFAULT_BYTES)
    }
}

impl Budget {
    /// At most `bytes`, and [`MAX_ENTRIES`] entries.
    pub fn new(bytes: u64) -> Budget {
        Budget {
            bytes_left: bytes,
            byte_limit: bytes,
            entries_left: MAX_ENTRIES,
            entry_limit: MAX_ENTRIES,
        }
    }

    /// The same budget with at most `entries` entries.
    pub fn max_entries(self, entries: u64) -> Budget {
        Budget {
            entries_left: entries,
            entry_limit: entries,
            ..self
        }
    }

    /// The byte cap.
    pub fn byte_limit(&self) -> u64 {
        self.byte_limit
    }

    /// Charges one entry: its count and [`ENTRY_COST`] bytes.
    ///
    /// # Errors
    /// The cap it passes.
    pub fn entry(&mut self) -> Result<(), Over> {
        if self.entries_left == 0 {
            return Err(Over::Entries(self.entry_limit));
        }
        self.entries_left -= 1;
        self.bytes(ENTRY_COST)
    }

    /// Charges `n` bytes of contents.
    ///
    /// # Errors
    /// [`Over::Bytes`] when fewer are left.
    pub fn bytes(&mut self, n: u64) -> Result<(), Over> {
        if n > self.bytes_left {
            self.bytes_left = 0;
            return Err(Over::Bytes(self.byte_limit));
        }
        self.bytes_left -= n;
        Ok(())
    }

    /// The bytes and entries charged so far.
    pub fn used(&self) -> (u64, u64) {
        (
            self.byte_limit - self.bytes_left,
            self.entry_limit - self.entries_left,
        )
    }

    /// Charges what an earlier budget used ([`Budget::used`]), as one step.
    ///
    /// # Errors
    /// The cap it passes.
    pub fn charge(&mut self, bytes: u64, entries: u64) -> Result<(), Over> {
        if entries > self.entries_left {
            self.entries_left = 0;
            return Err(Over::Entries(self.entry_limit));
        }
        self.entries_left -= entries;
        self.bytes(bytes)
    }

    /// The bytes left, for a reader that charges as it reads.
    pub fn bytes_left_mut(&mut self) -> &mut u64 {
        &mut self.bytes_left
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_cost_their_metadata_and_are_counted() {
        let mut b = Budget::new(2 * ENTRY_COST + 10).max_entries(3);
        assert_eq!(b.entry(), Ok(()));
        assert_eq!(b.bytes(10), Ok(()));
        assert_eq!(b.entry(), Ok(()));
        // Bytes run out first here: the third entry's metadata does not fit.
        assert_eq!(b.entry(), Err(Over::Bytes(2 * ENTRY_COST + 10)));
        let mut b = Budget::new(u64::MAX).max_entries(2);
        assert_eq!((b.entry(), b.entry()), (Ok(()), Ok(())));
        assert_eq!(b.entry(), Err(Over::Entries(2)));
        assert_eq!(b.entry(), Err(Over::Entries(2)));
        let mut b = Budget::new(5);
        assert_eq!(b.bytes(6), Err(Over::Bytes(5)));
        assert_eq!(
            b.bytes(1),
            Err(Over::Bytes(5)),
            "nothing is left after a refusal"
        );
    }
}
