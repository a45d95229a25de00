//! A reader over the byte chunks another thread sends through a channel: the consuming half
//! of a two-thread pipeline (the zstd encoder's input, a layer's decoded stream).

use std::io::{self, Read};
use std::sync::mpsc::Receiver;

/// Reads the chunks in order; an `Err` chunk is returned as the read's error, and a hung-up
/// sender is the end of the stream.
pub struct ChunkReader {
    queue: Receiver<io::Result<Vec<u8>>>,
    chunk: Vec<u8>,
    at: usize,
}

impl ChunkReader {
    /// Reads what arrives on `queue`.
    pub fn new(queue: Receiver<io::Result<Vec<u8>>>) -> ChunkReader {
        ChunkReader {
            queue,
            chunk: Vec::new(),
            at: 0,
        }
    }
}

impl Read for ChunkReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        while self.at == self.chunk.len() {
            match self.queue.recv() {
                Ok(Ok(chunk)) => (self.chunk, self.at) = (chunk, 0),
                Ok(Err(e)) => return Err(e),
                Err(_) => return Ok(0),
            }
        }
        let n = buf.len().min(self.chunk.len() - self.at);
        buf[..n].copy_from_slice(&self.chunk[self.at..self.at + n]);
        self.at += n;
        Ok(n)
    }
}
