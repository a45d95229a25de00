//! Assembling runtime base and builder images from `base-images/` recipes: Debian packages
//! (signed indexes, checked .debs), the runtime from the npm registry, synthesized distroless
//! files and the function server, as reproducible layers.

pub mod assemble;
pub mod bytecode;
pub mod debian;
pub mod licenses;
pub mod lock;
pub mod packages;
pub mod recipe;
pub mod rootfs;
pub mod servers;
pub mod store;
pub mod wheels;
