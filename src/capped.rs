//! Reading an HTTP body from a server kiln does not trust (a registry, a token realm, a
//! package index, a mirror) into memory, up to a limit: a declared length above it fails
//! before anything is read, a longer body as soon as it passes the limit. Each caller names
//! the limit and turns the two failures into its own errors.

/// Why a body was not read.
#[derive(Debug)]
pub enum Failure {
    /// It is longer than the limit, or says it will be.
    TooLarge,
    /// The transfer failed.
    Http(reqwest::Error),
}

/// The body of `resp`, at most `limit` bytes.
///
/// # Errors
/// [`Failure`].
pub async fn read(mut resp: reqwest::Response, limit: u64) -> Result<Vec<u8>, Failure> {
    if resp.content_length().is_some_and(|n| n > limit) {
        return Err(Failure::TooLarge);
    }
    let mut body = Vec::new();
    while let Some(chunk) = resp.chunk().await.map_err(Failure::Http)? {
        if (body.len() + chunk.len()) as u64 > limit {
            return Err(Failure::TooLarge);
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}
