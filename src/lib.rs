//! kiln: a daemonless, rootless builder that turns a serverless Function (handler source,
//! dependency manifest, runtime name) into an OCI image by appending a dependency layer and a
//! source layer to a runtime base image, and pushes it to a registry.
//!
//! # Layers
//!
//! Dependencies point one way, down this list: a module imports (`crate::…`) only the modules
//! named in its entry, all of them further down. `tests/it/structure.rs` reads this list and
//! every `crate::` path in `src/`, and fails on an arrow the list does not allow. `io_error`
//! (the one file-system error shape) and `testing` (unit-test helpers) may be used by any
//! module.
//!
//! - `cli`, `fuzzing`: anything.
//! - `controller`: `rebase` `git` `runtime` `registry` `oci` `signing` `cosign` `provenance`
//!   `k8s_names` `redact` `capped`.
//! - `rebase`: `build` `image` `runtime` `registry` `oci` `cosign` `provenance`.
//! - `prune`: `build` `base` `run` `image` `fetch` `registry` `oci` `inuse`.
//! - `build`: `run` `git` `image` `fetch` `runtime` `registry` `sandbox` `oci` `signing`
//!   `cosign` `provenance` `sbom` `k8s_names` `inuse` `progress` `rootpath` `tarmeter` `capped`.
//! - `cosign`: `provenance` `sbom` `registry` `oci` `signing`.
//! - `base`: `run` `image` `fetch` `runtime` `registry` `sandbox` `oci` `progress` `rootpath`
//!   `tarmeter` `capped`.
//! - `run`: `registry` `sandbox` `oci` `inuse` `progress` `rootpath` `tarmeter` `capped`.
//! - `image`: `registry` `oci` `progress` `capped`.
//! - `fetch`: `progress` `rootpath` `capped`.
//! - `git`: `origin` `redact` `progress` `capped`.
//! - `registry`: `oci` `origin` `redact` `progress` `capped`.
//! - `sandbox`: `rootpath`.
//! - `oci`: `rootpath` `tarmeter` `capped`.
//! - `provenance`: `oci`.
//! - `sbom`: `provenance` `oci`.
//! - `telemetry`: `progress`.
//! - `capped`, `inuse`, `io_error`, `k8s_names`, `origin`, `progress`, `redact`, `rootpath`,
//!   `runtime`, `signing`, `tarmeter`, `testing`: nothing.
//!
//! `oci` is the pure image model (its only file-system access is `rootpath`'s beneath-the-root
//! opens, for the source walker); `image` and `fetch` are the shared plumbing that `build` and
//! `base` stand on.

pub mod base;
pub mod build;
pub mod capped;
pub mod cli;
pub mod controller;
pub mod cosign;
pub mod fetch;
#[doc(hidden)]
pub mod fuzzing;
pub mod git;
pub mod image;
pub mod inuse;
pub mod io_error;
pub mod k8s_names;
pub mod oci;
pub mod origin;
pub mod progress;
pub mod provenance;
pub mod prune;
pub mod rebase;
pub mod redact;
pub mod registry;
pub mod rootpath;
pub mod run;
pub mod runtime;
pub mod sandbox;
pub mod sbom;
pub mod signing;
pub mod tarmeter;
pub mod telemetry;
#[cfg(test)]
pub(crate) mod testing;
