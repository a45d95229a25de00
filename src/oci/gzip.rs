//! The layer compressor: gzip whose bytes depend only on the input, never on the machine or
//! the thread count.
//!
//! Up to [`THRESHOLD`] bytes of tar, a layer is one plain gzip stream at the fixed level
//! (the bytes kiln always wrote: small layers, such as a source layer, keep their digests).
//! Above it, the tar is cut into [`BLOCK`]-sized blocks, each compressed on its own (a fresh
//! compressor, ending in a full flush, the last one finishing the stream) by as many threads
//! as the machine has, and the outputs are concatenated in order into one gzip member — what
//! `pigz --independent` does. A block's output is a function of its bytes alone, so 1 thread
//! and 8 give the same blob. The workers compress while the writer goes on reading files: at
//! most `2 × threads` blocks are in flight, whatever the layer's size.

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
    /// Full blocks kept until block mode starts (at most the threshold's worth).
    blocks: Vec<Vec<u8>>,
    /// The block being filled.
    current: Vec<u8>,
    crc: Crc,
    /// Until block mode starts: the length of each write, so that a small layer's plain
    /// stream can be made at the end from the very writes this writer got (zlib's output
    /// depends on how its input is split). Compressing as the writes come would compress a
    /// large layer's first [`THRESHOLD`] bytes twice, on the writing thread.
    splits: Option<Vec<usize>>,
    /// Once block mode started (the header is written): where blocks are compressed.
    pool: Option<Pool>,
}

/// Block compression: inline on one thread, else a pipeline of worker threads that the
/// writer keeps fed while it reads on — at most `2 × threads` blocks in flight, written in
/// order as they come back.
enum Pool {
    Inline(Compression),
    Workers {
        jobs: Option<std::sync::mpsc::SyncSender<(u64, Vec<u8>, bool)>>,
        done: std::sync::mpsc::Receiver<(u64, io::Result<Vec<u8>>)>,
        workers: Vec<std::thread::JoinHandle<()>>,
        /// Compressed blocks that came back before an earlier one.
        waiting: std::collections::BTreeMap<u64, Vec<u8>>,
        /// The next block to hand out, and the next to write.
        sent: u64,
        written: u64,
        window: u64,
    },
}

impl Pool {
    fn new(level: Compression, threads: usize) -> Pool {
        if threads <= 1 {
            return Pool::Inline(level);
        }
        let (jobs, queue) = std::sync::mpsc::sync_channel::<(u64, Vec<u8>, bool)>(threads);
        let queue = std::sync::Arc::new(std::sync::Mutex::new(queue));
        let (results, done) = std::sync::mpsc::channel();
        let workers = (0..threads)
            .map(|_| {
                let (queue, results) = (queue.clone(), results.clone());
                std::thread::spawn(move || {
                    loop {
                        let job = match queue.lock() {
                            Ok(q) => q.recv(),
                            Err(_) => return,
                        };
                        let Ok((index, block, last)) = job else {
                            return;
                        };
                        if results.send((index, deflate(&block, level, last))).is_err() {
                            return;
                        }
                    }
                })
            })
            .collect();
        Pool::Workers {
            jobs: Some(jobs),
            done,
            workers,
            waiting: std::collections::BTreeMap::new(),
            sent: 0,
            written: 0,
            window: 2 * threads as u64,
        }
    }

    /// Compresses `block` (the last one ends the stream) and writes what is ready, in order,
    /// to `out`; waits only while the window is full.
    fn push(&mut self, out: &mut impl Write, block: Vec<u8>, last: bool) -> io::Result<()> {
        match self {
            Pool::Inline(level) => out.write_all(&deflate(&block, *level, last)?),
            Pool::Workers {
                jobs, sent, window, ..
            } => {
                let jobs = jobs
                    .as_ref()
                    .ok_or_else(|| io::Error::other("the stream is finished"))?;
                jobs.send((*sent, block, last))
                    .map_err(|_| io::Error::other("a compressor thread died"))?;
                *sent += 1;
                let limit = *window;
                self.collect(out, limit)
            }
        }
    }

    /// Writes compressed blocks in order until at most `in_flight` remain outstanding.
    fn collect(&mut self, out: &mut impl Write, in_flight: u64) -> io::Result<()> {
        let Pool::Workers {
            done,
            waiting,
            sent,
            written,
            ..
        } = self
        else {
            return Ok(());
        };
        loop {
            while let Some(block) = waiting.remove(written) {
                out.write_all(&block)?;
                *written += 1;
            }
            if *sent - *written <= in_flight {
                return Ok(());
            }
            let (index, block) = done
                .recv()
                .map_err(|_| io::Error::other("a compressor thread died"))?;
            waiting.insert(index, block?);
        }
    }

    /// Writes every outstanding block and stops the workers.
    fn finish(mut self, out: &mut impl Write) -> io::Result<()> {
        self.collect(out, 0)?;
        if let Pool::Workers { jobs, workers, .. } = &mut self {
            drop(jobs.take());
            for worker in workers.drain(..) {
                worker
                    .join()
                    .map_err(|_| io::Error::other("a compressor thread panicked"))?;
            }
        }
        Ok(())
    }
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
            crc: Crc::new(),
            splits: Some(Vec::new()),
            pool: None,
        }
    }

    /// Starts block mode: the header, then the blocks kept so far.
    fn start_blocks(&mut self) -> io::Result<()> {
        self.splits = None;
        self.out.write_all(&HEADER)?;
        let mut pool = Pool::new(Compression::new(self.level), self.threads);
        for block in std::mem::take(&mut self.blocks) {
            pool.push(&mut self.out, block, false)?;
        }
        self.pool = Some(pool);
        Ok(())
    }

    /// Ends the stream and returns the inner writer.
    ///
    /// # Errors
    /// A failing write.
    pub fn finish(mut self) -> io::Result<W> {
        let current = std::mem::take(&mut self.current);
        if let Some(splits) = self.splits.take() {
            // Small: the plain stream, byte for byte what a GzEncoder given these writes
            // makes.
            let mut plain = GzBuilder::new().write(Vec::new(), Compression::new(self.level));
            let mut held = std::mem::take(&mut self.blocks);
            held.push(current);
            let held = held.concat();
            let mut rest = &held[..];
            for len in splits {
                let (part, tail) = rest.split_at(len.min(rest.len()));
                plain.write_all(part)?;
                rest = tail;
            }
            self.out.write_all(&plain.finish()?)?;
            return Ok(self.out);
        }
        // The last block (possibly empty) finishes the stream.
        let mut pool = match self.pool.take() {
            Some(pool) => pool,
            None => return Err(io::Error::other("block mode without a compressor")),
        };
        pool.push(&mut self.out, current, true)?;
        pool.finish(&mut self.out)?;
        self.out.write_all(&self.crc.sum().to_le_bytes())?;
        self.out.write_all(&self.crc.amount().to_le_bytes())?;
        Ok(self.out)
    }
}

impl<W: Write> Write for LayerGzip<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if let Some(splits) = &mut self.splits
            && !buf.is_empty()
        {
            splits.push(buf.len());
        }
        self.crc.update(buf);
        let mut rest = buf;
        while !rest.is_empty() {
            // More than the threshold: block mode from here on.
            if self.pool.is_none() && self.blocks.len() * BLOCK >= THRESHOLD {
                self.start_blocks()?;
            }
            let n = rest.len().min(BLOCK - self.current.len());
            self.current.extend_from_slice(&rest[..n]);
            rest = &rest[n..];
            if self.current.len() == BLOCK {
                let full = std::mem::replace(&mut self.current, Vec::with_capacity(BLOCK));
                // Never the last block: that is `current` at `finish`, however long.
                match &mut self.pool {
                    Some(pool) => pool.push(&mut self.out, full, false)?,
                    None => self.blocks.push(full),
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

    /// A writer that fails after `left` bytes.
    struct Failing {
        left: usize,
    }

    impl Write for Failing {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            if buf.len() > self.left {
                return Err(io::Error::other("disk full"));
            }
            self.left -= buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_failing_output_is_an_error_not_a_hang() {
        let data = sample(THRESHOLD + 6 * BLOCK);
        for threads in [1, 2, 4] {
            let mut gz = LayerGzip::new(Failing { left: 1 << 20 }, 6, threads);
            let written = data.chunks(64 * 1024).try_for_each(|p| gz.write_all(p));
            let err = written.and_then(|()| gz.finish().map(|_| ())).unwrap_err();
            assert_eq!(err.to_string(), "disk full", "{threads} threads");
        }
    }

    #[test]
    fn up_to_the_threshold_the_stream_is_the_plain_one_for_the_same_writes() {
        for len in [0, 1000, THRESHOLD] {
            let data = sample(len);
            // Writes of uneven sizes, as a tar writer makes them (headers, file bodies).
            let sizes = [512, 10_000, 1, 70_000, 3];
            let mut parts = Vec::new();
            let mut rest = &data[..];
            for size in sizes.iter().cycle() {
                if rest.is_empty() {
                    break;
                }
                let (part, tail) = rest.split_at((*size).min(rest.len()));
                parts.push(part);
                rest = tail;
            }
            let mut plain = GzBuilder::new().write(Vec::new(), Compression::new(6));
            let mut gz = LayerGzip::new(Vec::new(), 6, 4);
            for part in &parts {
                plain.write_all(part).unwrap();
                gz.write_all(part).unwrap();
            }
            let plain = plain.finish().unwrap();
            assert_eq!(gz.finish().unwrap(), plain, "{len} bytes");
            assert_eq!(gunzip(&plain), data);
        }
    }
}
