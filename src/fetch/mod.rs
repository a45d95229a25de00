//! Fetching what images and installs are made of, over HTTPS: downloads verified against the
//! hash they were pinned with while they stream, with size and stall limits and progress
//! (`download`), and npm registry tarballs and packuments (`npm`). Used by base images
//! (`crate::base`) and by builds' own lock-file and pinned installs (`crate::build`).

pub mod download;
pub mod npm;
