//! gix's HTTP backend with a limit on what a git server may send over one connection: the
//! headers and bodies of every response (the reference listing, which gix keeps in memory,
//! and the pack, which it writes to disk) are counted together, and past the limit the next
//! read fails. A server cannot make kiln hold or store more than the limit by answering
//! without end.

use std::io::{self, BufRead, Read};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use gix::protocol::transport::client::blocking_io::http::{
    GetResponse, Http, PostBodyDataKind, PostResponse,
};

/// What one connection has received since its last [`Budget::restart`], and its limit.
#[derive(Debug)]
pub(super) struct Budget {
    received: AtomicU64,
    limit: AtomicU64,
}

impl Budget {
    pub(super) fn new(limit: u64) -> Arc<Budget> {
        Arc::new(Budget {
            received: AtomicU64::new(0),
            limit: AtomicU64::new(limit),
        })
    }

    /// Counts from zero again against `limit`: the next phase of the connection has its own.
    pub(super) fn restart(&self, limit: u64) {
        self.limit.store(limit, Ordering::Relaxed);
        self.received.store(0, Ordering::Relaxed);
    }

    /// Whether the server has sent more than the limit.
    pub(super) fn exceeded(&self) -> bool {
        self.received.load(Ordering::Relaxed) > self.limit.load(Ordering::Relaxed)
    }
}

/// An [`Http`] backend whose responses draw on one [`Budget`].
pub(super) struct Capped<H> {
    inner: H,
    budget: Arc<Budget>,
}

impl<H> Capped<H> {
    pub(super) fn new(inner: H, budget: Arc<Budget>) -> Capped<H> {
        Capped { inner, budget }
    }

    fn wrap<R>(&self, inner: R) -> Reader<R> {
        Reader {
            inner,
            budget: Arc::clone(&self.budget),
        }
    }
}

impl<H: Http> Http for Capped<H> {
    type Headers = Reader<H::Headers>;
    type ResponseBody = Reader<H::ResponseBody>;
    type PostBody = H::PostBody;

    fn get(
        &mut self,
        url: &str,
        base_url: &str,
        headers: impl IntoIterator<Item = impl AsRef<str>>,
    ) -> gix::Result<GetResponse<Self::Headers, Self::ResponseBody>> {
        let GetResponse { headers, body } = self.inner.get(url, base_url, headers)?;
        Ok(GetResponse {
            headers: self.wrap(headers),
            body: self.wrap(body),
        })
    }

    fn post(
        &mut self,
        url: &str,
        base_url: &str,
        headers: impl IntoIterator<Item = impl AsRef<str>>,
        body: PostBodyDataKind,
    ) -> gix::Result<PostResponse<Self::Headers, Self::ResponseBody, Self::PostBody>> {
        let PostResponse {
            post_body,
            headers,
            body,
        } = self.inner.post(url, base_url, headers, body)?;
        Ok(PostResponse {
            post_body,
            headers: self.wrap(headers),
            body: self.wrap(body),
        })
    }

    fn configure(&mut self, config: &dyn std::any::Any) -> gix::Result {
        self.inner.configure(config)
    }

    fn redirected_base_url(&self) -> Option<String> {
        self.inner.redirected_base_url()
    }
}

/// A response stream that counts what is consumed from it and fails once the budget is
/// spent (at most one buffer past the limit).
pub(super) struct Reader<R> {
    inner: R,
    budget: Arc<Budget>,
}

impl<R: BufRead> Read for Reader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        let available = self.fill_buf()?;
        let n = available.len().min(buf.len());
        buf[..n].copy_from_slice(&available[..n]);
        self.consume(n);
        Ok(n)
    }
}

impl<R: BufRead> BufRead for Reader<R> {
    fn fill_buf(&mut self) -> io::Result<&[u8]> {
        if self.budget.exceeded() {
            return Err(io::Error::other(format!(
                "the git server sent more than {} bytes",
                self.budget.limit.load(Ordering::Relaxed)
            )));
        }
        self.inner.fill_buf()
    }

    fn consume(&mut self, amount: usize) {
        self.inner.consume(amount);
        self.budget
            .received
            .fetch_add(amount as u64, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reader_fails_once_its_connection_has_received_past_the_limit() {
        let budget = Budget::new(10);
        let first = Reader {
            inner: &b"0123456"[..],
            budget: Arc::clone(&budget),
        };
        let mut second = Reader {
            inner: io::BufReader::new(io::repeat(b'x').take(1 << 20)),
            budget: Arc::clone(&budget),
        };
        // Two responses of one connection draw on one budget.
        assert_eq!(
            io::read_to_string(first).expect("within the limit"),
            "0123456"
        );
        let mut buf = [0u8; 4];
        second.read_exact(&mut buf).expect("11 bytes so far");
        let err = io::copy(&mut second, &mut io::sink()).expect_err("past the limit");
        assert!(err.to_string().contains("more than 10 bytes"), "{err}");
        assert!(budget.exceeded());
        budget.restart(1 << 20);
        assert!(!budget.exceeded(), "a new phase counts from zero");
        second.read_exact(&mut buf).expect("within the new limit");
    }
}
