//! The image model: pure, synchronous and byte-exact. Digests, media types, descriptors,
//! manifests, indexes, configs, the deterministic layer writer, appending layers to a base,
//! OCI image layouts and the invariant validator. Nothing here does network I/O or reads the
//! environment, and nothing here imports from the rest of the crate.

pub mod budget;
pub mod canonical;
mod chunks;
mod config;
mod descriptor;
mod digest;
pub mod gzip;
pub mod image;
mod index;
pub mod layer;
pub mod layout;
mod manifest;
mod media_type;
pub mod source;
pub mod validate;
pub mod zstd;

pub use chunks::ChunkReader;
pub use config::{History, ImageConfig, RootFs, RunConfig, epoch_of, rfc3339};
pub use descriptor::{Descriptor, Platform};
pub use digest::{Digest, DigestError, Hasher, HashingReader, HashingWriter};
pub use image::{Base, ConfigEdit, Image, NewLayer};
pub use index::Index;
pub use layer::{Content, EntryKind, LayerBlob, LayerEntry};
pub use layout::Layout;
pub use manifest::{Document, Manifest, named_media_type, sniff_media_type};
pub use media_type::{Compression, Family, MediaType};
