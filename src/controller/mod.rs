//! The Function controller: Kyma's Function flow with kiln as the builder. A `Function`
//! resource becomes a source ConfigMap, a build Job running `kiln build` in the runtime's
//! builder image, and a Deployment + Service (+ HPA) running the image by digest. It never
//! builds images itself; besides asking the registry whether an image exists, it writes to it
//! only to rebase an image it built onto the runtime's new base (`rebases`).

pub mod apply;
pub mod builds;
pub mod conditions;
pub mod config;
pub mod context;
pub mod crd;
pub mod defaults;
pub mod deploy;
pub mod error;
pub mod key;
pub mod leader;
pub mod lookup;
pub mod metrics;
pub mod names;
pub mod override_image;
pub mod plan;
pub mod plumbing;
pub mod presets;
pub mod quantity;
pub mod rebases;
pub mod reconcile;
pub mod records;
pub mod render;
pub mod runner;
pub mod server;
pub mod slots;
pub mod status;
pub mod stores;
pub mod sweep;
pub mod validate;
pub mod webhook;
