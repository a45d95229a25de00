//! Images as kiln assembles and ships them, above the pure model (`oci`) and the registry
//! client (`registry`): resolving a base image (`resolve`), publishing an image's blobs and
//! manifest to a registry or a layout (`publish`), and what was pushed (`pushed`). Shared by
//! Function builds (`crate::build`) and base-image builds (`crate::base`).

pub mod publish;
pub mod pushed;
pub mod resolve;
