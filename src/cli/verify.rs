//! `kiln verify IMAGE --key FILE`: checks an image's cosign-style signature.

use anyhow::{Context, anyhow};
use clap::Args;

use super::Failure;
use super::registry::RegistryArgs;
use crate::cosign::{self, VerifyKey};
use crate::registry::{Client, Reference};

/// Flags of `kiln verify`.
#[derive(Debug, Args)]
#[command(after_help = "Examples:
  kiln verify reg.example.com/fns/orders:latest --key cosign.pub
  kiln verify reg.example.com/fns/orders@sha256:… --key env://SIGNING_PUBLIC_KEY")]
pub struct VerifyArgs {
    /// The image, by tag or digest (what `kiln build` prints). For an image index (a build for
    /// several platforms) the index's signature is checked, then each image it lists.
    #[arg(value_name = "IMAGE")]
    pub image: String,
    /// The ECDSA P-256 public key (PEM `PUBLIC KEY`, as `cosign generate-key-pair` and
    /// `openssl pkey -pubout` write it): a file, or `env://VAR`.
    #[arg(long, value_name = "FILE|env://VAR")]
    pub key: String,
    /// The build key the image must have been built as (`dev.kiln.build-key`, as the
    /// controller and `--report` name it): the image's SLSA provenance, signed by --key, must
    /// exist and say so. Without it, a provenance by the key that exists must still name the
    /// image. Of an image index, each image it lists is asked: as each platform has a build
    /// key of its own, check theirs image by image.
    #[arg(long, value_name = "sha256:HEX")]
    pub build_key: Option<String>,
    #[command(flatten)]
    pub registry: RegistryArgs,
}

/// Reads a PEM key named by `spec` (a file, or `env://VAR`) with `parse`. The key's text never
/// appears in an error.
///
/// # Errors
/// An unreadable file, an unset variable, or a key `parse` refuses.
pub(super) fn read_key<K, E: std::error::Error + Send + Sync + 'static>(
    spec: &str,
    flag: &str,
    parse: impl Fn(&str) -> Result<K, E>,
) -> anyhow::Result<K> {
    let text = match spec.strip_prefix("env://") {
        Some(var) => std::env::var(var)
            .map_err(|_| anyhow!("{flag} {spec}: the environment variable {var} is not set"))?,
        None => {
            let bytes = std::fs::File::open(spec)
                .and_then(|f| crate::rootpath::read_to_limit(f, crate::signing::MAX_KEY_FILE))
                .with_context(|| format!("reading {flag} {spec}"))?;
            String::from_utf8(bytes).map_err(|_| anyhow!("{flag} {spec}: not a PEM text file"))?
        }
    };
    parse(&text).with_context(|| format!("{flag} {spec}"))
}

pub(super) async fn run(args: VerifyArgs) -> Result<String, Failure> {
    let key = read_key(&args.key, "--key", VerifyKey::from_pem).map_err(Failure::Usage)?;
    let image: Reference = args
        .image
        .parse()
        .with_context(|| format!("invalid image reference {:?}", args.image))
        .map_err(Failure::Usage)?;
    let client = Client::new(args.registry.client_config().map_err(Failure::Usage)?)
        .context("setting up the registry client")
        .map_err(Failure::Usage)?;
    let verified = cosign::verify_image(
        &client,
        &image,
        &key,
        cosign::Wanted {
            build_key: args.build_key.as_deref(),
            pushed_as: None,
        },
    )
    .await
    .map_err(|e| Failure::Build(e.into()))?;
    match &verified.build_key {
        Some(build_key) => tracing::info!(
            key = %key.id(), digest = %verified.digest, %build_key,
            "verified the image's signature and its provenance"
        ),
        None => tracing::info!(
            key = %key.id(), digest = %verified.digest,
            "verified the image's signature (no provenance by this key)"
        ),
    }
    Ok(format!("{}@{}", image.repository_path(), verified.digest))
}
