//! The Function controller: Kyma's Function flow with kiln as the builder. A `Function`
//! resource becomes a source ConfigMap, a build Job running `kiln build` in the runtime's
//! builder image, and a Deployment + Service (+ HPA) running the image by digest. It never
//! builds images itself; it asks the registry only whether an image already exists.

pub mod crd;
pub mod presets;
