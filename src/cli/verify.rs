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
    /// image.
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
    let verified = cosign::verify(
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
    verify_platforms(&client, &image, &key, &verified.digest).await?;
    Ok(format!("{}@{}", image.repository_path(), verified.digest))
}

/// When `digest` is an image index (a build for several platforms), each image it lists must
/// verify too: its signature by `key`, and a provenance by `key` that names it if one exists.
async fn verify_platforms(
    client: &Client,
    image: &Reference,
    key: &VerifyKey,
    digest: &crate::oci::Digest,
) -> Result<(), Failure> {
    let doc = client
        .get_manifest(
            &image.with_digest(digest.clone()),
            &crate::registry::DEFAULT_MANIFEST_TYPES,
        )
        .await
        .with_context(|| format!("reading {}@{digest}", image.repository_path()))
        .map_err(Failure::Build)?;
    if !doc.media_type.is_index() {
        return Ok(());
    }
    let index: crate::oci::Index = doc
        .parse()
        .with_context(|| format!("{}@{digest} is not an image index", image.repository_path()))
        .map_err(Failure::Build)?;
    for entry in index
        .manifests
        .iter()
        .filter(|d| d.media_type.is_manifest())
    {
        let platform = entry
            .platform
            .as_ref()
            .map_or_else(|| "no platform".to_string(), ToString::to_string);
        let one = image.with_digest(entry.digest.clone());
        let wanted = cosign::Wanted {
            build_key: None,
            pushed_as: None,
        };
        cosign::verify(client, &one, key, wanted)
            .await
            .with_context(|| format!("the {platform} image {} of the index", entry.digest))
            .map_err(Failure::Build)?;
        tracing::info!(%platform, digest = %entry.digest, "verified the platform's image");
    }
    Ok(())
}
