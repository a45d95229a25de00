//! kiln: a daemonless, rootless builder that turns a serverless Function (handler source,
//! dependency manifest, runtime name) into an OCI image by appending a dependency layer and a
//! source layer to a runtime base image, and pushes it to a registry.
//!
//! Dependencies point one way: `cli → build → {oci, registry, runtime}`; `oci` is pure.

pub mod base;
pub mod build;
pub mod capped;
pub mod cli;
pub mod controller;
pub mod fetch;
#[doc(hidden)]
pub mod fuzzing;
pub mod git;
pub mod image;
pub mod inuse;
pub mod k8s_names;
pub mod oci;
pub mod progress;
pub mod prune;
pub mod redact;
pub mod registry;
pub mod rootpath;
pub mod run;
pub mod runtime;
pub mod sandbox;
pub mod tarmeter;
pub mod telemetry;
#[cfg(test)]
pub(crate) mod testing;
