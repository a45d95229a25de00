//! [`UploadPolicy`]: the size thresholds that pick a blob upload's strategy. A plain value
//! in the client's configuration; it names no other file of the registry client.

/// Size thresholds that pick the upload strategy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UploadPolicy {
    /// Blobs up to this size first try the single-request `POST ?digest=` (default 1 MiB).
    pub monolithic_max: u64,
    /// Blobs above this size are uploaded in chunks (default 256 MiB).
    pub chunked_threshold: u64,
    /// Chunk size for chunked uploads (default 32 MiB; raised to the registry's
    /// `OCI-Chunk-Min-Length`).
    pub chunk_size: u64,
}

impl Default for UploadPolicy {
    fn default() -> Self {
        UploadPolicy {
            monolithic_max: 1 << 20,
            chunked_threshold: 256 << 20,
            chunk_size: 32 << 20,
        }
    }
}
