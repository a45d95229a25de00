//! The zstd layer compressor: ruzstd's pure-Rust encoder at its fastest level (pinned, so the
//! bytes depend only on the input; its frames do not depend on how the input is split). The
//! encoder pulls its input from a reader, so it runs on a thread of its own, fed the tar
//! stream through a bounded channel, while the writing thread goes on reading files.

use std::io::{self, Write};
use std::sync::mpsc::{SyncSender, sync_channel};
use std::thread::JoinHandle;

/// Writes what it is given, zstd-compressed, to the inner writer. [`ZstdWriter::finish`]
/// ends the frame and returns the inner writer.
pub struct ZstdWriter<W: Write + Send + 'static> {
    chunks: Option<SyncSender<io::Result<Vec<u8>>>>,
    encoder: Option<JoinHandle<Drain<W>>>,
    pending: Vec<u8>,
}

/// Bytes in one hand-over to the encoder thread.
const CHUNK: usize = 256 * 1024;

impl<W: Write + Send + 'static> ZstdWriter<W> {
    /// A compressor writing to `out`.
    pub fn new(out: W) -> ZstdWriter<W> {
        let (chunks, queue) = sync_channel(4);
        let encoder = std::thread::spawn(move || {
            let mut drain = Drain { out, error: None };
            ruzstd::encoding::compress(
                super::ChunkReader::new(queue),
                &mut drain,
                ruzstd::encoding::CompressionLevel::Fastest,
            );
            drain
        });
        ZstdWriter {
            chunks: Some(chunks),
            encoder: Some(encoder),
            pending: Vec::with_capacity(CHUNK),
        }
    }

    fn send(&mut self) -> io::Result<()> {
        let chunk = std::mem::replace(&mut self.pending, Vec::with_capacity(CHUNK));
        match &self.chunks {
            Some(chunks) if chunks.send(Ok(chunk)).is_ok() => Ok(()),
            _ => Err(io::Error::other("the zstd encoder stopped")),
        }
    }

    /// Ends the frame and returns the inner writer.
    ///
    /// # Errors
    /// A failing write to the inner writer, or an encoder that stopped.
    pub fn finish(mut self) -> io::Result<W> {
        if !self.pending.is_empty() {
            self.send()?;
        }
        drop(self.chunks.take());
        let drain = self
            .encoder
            .take()
            .ok_or_else(|| io::Error::other("finished twice"))?
            .join()
            .map_err(|_| io::Error::other("the zstd encoder panicked"))?;
        match drain.error {
            Some(e) => Err(e),
            None => Ok(drain.out),
        }
    }
}

impl<W: Write + Send + 'static> Write for ZstdWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = buf.len().min(CHUNK - self.pending.len());
        self.pending.extend_from_slice(&buf[..n]);
        if self.pending.len() == CHUNK {
            self.send()?;
        }
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// The encoder's output. The encoder panics on a write error, so the first error is kept
/// here (and everything after it dropped) for `finish` to return.
struct Drain<W> {
    out: W,
    error: Option<io::Error>,
}

impl<W: Write> Write for Drain<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if self.error.is_none()
            && let Err(e) = self.out.write_all(buf)
        {
            self.error = Some(e);
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::io::Read;

    use super::*;

    fn compress(data: &[u8], write_size: usize) -> Vec<u8> {
        let mut z = ZstdWriter::new(Vec::new());
        for part in data.chunks(write_size.max(1)) {
            z.write_all(part).unwrap_or_else(|e| panic!("{e}"));
        }
        z.finish().unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn the_frame_depends_on_the_bytes_only_and_decodes_back() {
        let data: Vec<u8> = (0..3_000_000u32)
            .map(|i| {
                if i % 7 == 0 {
                    (i % 251) as u8
                } else {
                    b"kiln"[(i % 4) as usize]
                }
            })
            .collect();
        let one = compress(&data, 1 << 20);
        assert!(one.len() < data.len() / 3, "{} bytes", one.len());
        assert_eq!(compress(&data, 4096), one);
        assert_eq!(compress(&data, 777_777), one);
        let mut back = Vec::new();
        ruzstd::decoding::StreamingDecoder::new(&one[..])
            .unwrap_or_else(|e| panic!("{e}"))
            .read_to_end(&mut back)
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(back, data);
        // Empty input is a valid frame too.
        let empty = compress(b"", 1);
        let mut back = Vec::new();
        ruzstd::decoding::StreamingDecoder::new(&empty[..])
            .unwrap_or_else(|e| panic!("{e}"))
            .read_to_end(&mut back)
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(back.is_empty());
    }

    struct Full;

    impl Write for Full {
        fn write(&mut self, _: &[u8]) -> io::Result<usize> {
            Err(io::Error::other("disk full"))
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_failing_output_is_an_error_not_a_panic() {
        let mut z = ZstdWriter::new(Full);
        z.write_all(&[7u8; 100_000])
            .unwrap_or_else(|e| panic!("{e}"));
        let err = z.finish().err().map(|e| e.to_string());
        assert_eq!(err.as_deref(), Some("disk full"));
    }
}
