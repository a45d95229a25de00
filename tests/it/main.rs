//! kiln's integration tests, in one binary (one link of the crate and its dependencies
//! instead of one per file; nextest still runs every test in its own process). Each module
//! is one area, as its first lines say; `common` is the shared harness, `kubelet` the test
//! kubelet.
//!
//! Run one area with `cargo nextest run --test it -E 'test(/^build_errors::/)'`.

#![allow(clippy::unwrap_used)]

#[path = "../common/mod.rs"]
mod common;
#[path = "../common/kubelet/mod.rs"]
mod kubelet;

mod base_images;
mod build_auth;
mod build_cache_repo;
mod build_deps;
mod build_errors;
mod build_git;
mod build_layout;
mod build_lockfile;
mod build_lying_registry;
mod build_pinned;
mod build_registry;
mod build_stages;
mod build_termination_log;
mod build_unchanged;
mod build_view;
mod cache_prune;
mod completions;
mod controller;
mod controller_e2e;
mod controller_rbac;
mod controller_rebase;
mod debian;
mod deploy;
mod dev;
mod dockerfile;
mod foreign_images;
mod harness;
mod install_leaves;
mod install_reads;
mod k8s_validate;
mod kube_api;
mod kube_api_strict;
mod kubectl;
mod kubelet_api;
mod kubelet_jobs;
mod kubelet_replicas;
mod rebase;
mod rebase_proof;
mod registry_client;
mod registry_faults;
mod run;
mod runtime_servers;
mod sign;
mod sign_referrers;
mod structure;
mod tenancy;
mod warm;
mod webhook;
