//! The layer compressor: gzip whose bytes depend only on the input, never on the machine or
//! the thread count.
//!
//! Up to [`THRESHOLD`] bytes of tar, a layer is one plain gzip stream at the fixed level
//! (the bytes kiln always wrote: small layers, such as a source layer, keep their digests).
//! Above it, the tar is cut into [`BLOCK`]-sized blocks, each compressed on its own (a fresh
//! compressor, ending in a full flush, the last one finishing the stream) by as many threads
//! as the machine has, and the outputs are concatenated in order into one gzip member — what
//! `pigz --independent` does. A block's output is a function of its bytes alone, so 1 thread
//! and 8 give the same blob. At most `2 × threads` blocks are in flight, whatever the layer's
//! size.

use std::io::{self, Write};

use flate2::{Compress, Compression, Crc, FlushCompress, GzBuilder, Status};

/// The uncompressed size of one block.
pub const BLOCK: usize = 1 << 20;
/// Layers whose tar is at most this large are one plain stream.
pub const THRESHOLD: usize = 8 * BLOCK;
/// The gzip header of a block-compressed layer: no name, no time, XFL 0, OS unknown.
const HEADER: [u8; 10] = [0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 0xff];

/// A gzip writer (see the module docs). [`LayerGzip::finish`] returns the inner writer.
pub struct LayerGzip<W: Write> {
    out: W,
    level: u32,
    threads: usize,
    /// Full blocks not yet compressed, then the block being filled.
    blocks: Vec<Vec<u8>>,
    current: Vec<u8>,
    /// Whether block mode started (the header is written).
    started: bool,
    crc: Crc,
    /// Until block mode starts: the plain stream, fed the very writes this writer gets
    /// (zlib's output depends on how its input is split), in memory.
    plain: Option<flate2::write::GzEncoder<Vec<u8>>>,
}

impl<W: Write> LayerGzip<W> {
    /// A compressor at `level` writing to `out`, compressing blocks on `threads` threads.
    pub fn new(out: W, level: u32, threads: usize) -> LayerGzip<W> {
        LayerGzip {
            out,
            level,
            threads: threads.max(1),
            blocks: Vec::new(),
            current: Vec::with_capacity(BLOCK),
            started: false,
            crc: Crc::new(),
            plain: Some(GzBuilder::new().write(Vec::new(), Compression::new(level))),
        }
    }

    /// Compresses the waiting blocks in parallel and writes them in order; with `last`, the
    /// final one finishes the deflate stream.
    fn flush_blocks(&mut self, last: bool) -> io::Result<()> {
        if !self.started {
            self.out.write_all(&HEADER)?;
            self.started = true;
        }
        let level = Compression::new(self.level);
        let blocks = std::mem::take(&mut self.blocks);
        let count = blocks.len();
        let chunk = count.div_ceil(self.threads).max(1);
        let compressed: Vec<io::Result<Vec<u8>>> = std::thread::scope(|s| {
            let handles: Vec<_> = blocks
                .chunks(chunk)
                .enumerate()
                .map(|(c, group)| {
                    s.spawn(move || {
                        group
                            .iter()
                            .enumerate()
                            .map(|(i, b)| deflate(b, level, last && c * chunk + i + 1 == count))
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            handles
                .into_iter()
                .flat_map(|h| {
                    h.join().unwrap_or_else(|_| {
                        vec![Err(io::Error::other("a compressor thread panicked"))]
                    })
                })
                .collect()
        });
        for block in compressed {
            self.out.write_all(&block?)?;
        }
        Ok(())
    }

    /// Ends the stream and returns the inner writer.
    ///
    /// # Errors
    /// A failing write.
    pub fn finish(mut self) -> io::Result<W> {
        let current = std::mem::take(&mut self.current);
        if let Some(plain) = self.plain.take() {
            // Small: the plain stream, byte for byte what a GzEncoder given these writes
            // makes.
            self.out.write_all(&plain.finish()?)?;
            return Ok(self.out);
        }
        // The last block (possibly empty) finishes the stream.
        self.blocks.push(current);
        self.flush_blocks(true)?;
        self.out.write_all(&self.crc.sum().to_le_bytes())?;
        self.out.write_all(&self.crc.amount().to_le_bytes())?;
        Ok(self.out)
    }
}

impl<W: Write> Write for LayerGzip<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if let Some(plain) = &mut self.plain {
            plain.write_all(buf)?;
        }
        self.crc.update(buf);
        let mut rest = buf;
        while !rest.is_empty() {
            // More than the threshold: block mode from here on.
            if !self.started && self.blocks.len() * BLOCK >= THRESHOLD {
                self.plain = None;
                self.flush_blocks(false)?;
            }
            let n = rest.len().min(BLOCK - self.current.len());
            self.current.extend_from_slice(&rest[..n]);
            rest = &rest[n..];
            if self.current.len() == BLOCK {
                let full = std::mem::replace(&mut self.current, Vec::with_capacity(BLOCK));
                self.blocks.push(full);
                // Never the last block: that is `current` at `finish`, however long.
                if self.started && self.blocks.len() >= 2 * self.threads {
                    self.flush_blocks(false)?;
                }
            }
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// One block as raw deflate: a fresh compressor, a full flush (byte-aligned, no history for
/// the next block) or, for the last block, the end of the stream.
fn deflate(block: &[u8], level: Compression, last: bool) -> io::Result<Vec<u8>> {
    let mut c = Compress::new(level, false);
    let flush = if last {
        FlushCompress::Finish
    } else {
        FlushCompress::Full
    };
    let mut out = Vec::with_capacity(block.len() + block.len() / 8 + 1024);
    loop {
        let consumed = usize::try_from(c.total_in()).unwrap_or(usize::MAX);
        let status = c
            .compress_vec(&block[consumed.min(block.len())..], &mut out, flush)
            .map_err(io::Error::other)?;
        let done = usize::try_from(c.total_in()).unwrap_or(usize::MAX) == block.len();
        match status {
            Status::StreamEnd => return Ok(out),
            // A full flush is complete when all input is in and output space is left over.
            Status::Ok | Status::BufError if !last && done && out.len() < out.capacity() => {
                return Ok(out);
            }
            _ => out.reserve(out.capacity().max(64 * 1024)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    /// Bytes that compress somewhat, like a tar of source and binaries.
    fn sample(len: usize) -> Vec<u8> {
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        (0..len)
            .map(|i| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                if i % 3 == 0 {
                    (x % 251) as u8
                } else {
                    b"kiln layer "[i % 11]
                }
            })
            .collect()
    }

    fn compress(data: &[u8], threads: usize, chunk: usize) -> Vec<u8> {
        let mut gz = LayerGzip::new(Vec::new(), 6, threads);
        for part in data.chunks(chunk) {
            gz.write_all(part).unwrap();
        }
        gz.finish().unwrap()
    }

    fn gunzip(data: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        flate2::read::GzDecoder::new(data)
            .read_to_end(&mut out)
            .unwrap();
        out
    }

    #[test]
    fn above_the_threshold_the_blob_is_the_same_for_any_thread_count_and_write_size() {
        for len in [
            THRESHOLD + 1,
            THRESHOLD + BLOCK,
            21 * BLOCK + 77,
            24 * BLOCK,
        ] {
            let data = sample(len);
            let one = compress(&data, 1, 64 * 1024);
            for (threads, chunk) in [(2, 1 << 20), (8, 4096), (3, 777_777)] {
                assert_eq!(
                    compress(&data, threads, chunk),
                    one,
                    "{len} bytes, {threads} threads"
                );
            }
            assert_eq!(gunzip(&one), data, "{len} bytes");
            // gzip(1) reads it too (one member, checked CRC and size).
            let mut child = std::process::Command::new("gzip")
                .args(["-t", "-"])
                .stdin(std::process::Stdio::piped())
                .spawn()
                .unwrap();
            child.stdin.take().unwrap().write_all(&one).unwrap();
            assert!(child.wait().unwrap().success(), "{len} bytes");
        }
    }

    #[test]
    fn up_to_the_threshold_the_stream_is_the_plain_one_for_the_same_writes() {
        for len in [0, 1000, THRESHOLD] {
            let data = sample(len);
            let mut plain = GzBuilder::new().write(Vec::new(), Compression::new(6));
            for part in data.chunks(10_000) {
                plain.write_all(part).unwrap();
            }
            let plain = plain.finish().unwrap();
            assert_eq!(compress(&data, 4, 10_000), plain, "{len} bytes");
            assert_eq!(gunzip(&plain), data);
        }
    }
}
