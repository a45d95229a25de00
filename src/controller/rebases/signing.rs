//! Signed rebases. With `--image-signing-secret` the controller signs the images it rebases
//! as a build Job's publishing container signs what it builds: the signature, an SLSA
//! provenance of the rebase that names the Function's build key tag as where it went, and the
//! SBOM ([`crate::rebase::attest`]). So a rebased fleet stays signed, and
//! `--require-provenance` deploys it without a Job.
//!
//! The key is read from the Secret in the controller's namespace, which the controller reads
//! anyway to copy it next to the build Jobs; it is never written anywhere, and no third-party
//! code runs in the controller. A cosign-encrypted key is decrypted once per version of the
//! Secret (scrypt makes each decryption cost a fraction of a second), and must be the private
//! half of the Secret's `cosign.pub`, which the controller checks images against.

use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::Secret;
use kube::Api;

use super::super::config::{IMAGE_SIGNING_KEY, IMAGE_SIGNING_PASSWORD, IMAGE_VERIFY_KEY};
use super::super::context::Context;
use crate::cosign::{KeyError, SignKey, VerifyKey};
use crate::rebase::attest::Signer;

/// The signing key as last read: the Secret's resourceVersion, the key, and whether the
/// Secret's `cosign.pub` is its public half (checked) rather than absent.
#[derive(Default)]
pub struct SigningKeys(Mutex<Option<(String, Arc<SignKey>, bool)>>);

/// A rebase's signing: the key, and when the rebase started.
pub struct Signing {
    key: Arc<SignKey>,
    started: String,
    /// The Secret holds `cosign.pub`, this key's public half.
    published: bool,
}

impl Signing {
    /// The Secret's `cosign.pub`, as read with the key: what the rebased image is checked
    /// against (`--require-provenance`) without reading the Secret again.
    pub fn verify_key(&self) -> Option<VerifyKey> {
        self.published.then(|| self.key.public().clone())
    }

    /// The [`Signer`] for [`crate::rebase::attest`]; the SBOM's layer readings are kept in
    /// the controller's temporary directory.
    pub fn signer<'a>(&'a self, cache_dir: &'a std::path::Path) -> Signer<'a> {
        Signer {
            key: &self.key,
            cache_dir,
            started: &self.started,
        }
    }
}

/// Where the SBOM's readings of layers are kept: each layer's components, by digest.
pub fn cache_dir() -> std::path::PathBuf {
    std::env::temp_dir().join("kiln-controller")
}

/// With `--image-signing-secret`, the key to sign a rebase with; `None` without.
///
/// # Errors
/// The Secret cannot be read, or holds no key that parses (the reason, for the status).
pub async fn signing(ctx: &Context) -> Result<Option<Signing>, String> {
    let Some(secret) = &ctx.config.image_signing_secret else {
        return Ok(None);
    };
    let started = crate::provenance::now();
    let namespace = &ctx.config.namespace;
    let shown = format!("the image signing Secret {namespace}/{secret}");
    let api: Api<Secret> = Api::namespaced(ctx.client.clone(), namespace);
    let found = api
        .get_opt(secret)
        .await
        .map_err(|e| format!("reading {shown}: {e}"))?
        .ok_or_else(|| format!("{shown} does not exist"))?;
    let version = found.metadata.resource_version.clone().unwrap_or_default();
    {
        let kept = ctx.signing_keys.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((v, key, published)) = kept.as_ref()
            && *v == version
        {
            return Ok(Some(Signing {
                key: key.clone(),
                started,
                published: *published,
            }));
        }
    }
    let data = found.data.unwrap_or_default();
    let text = |name: &str| {
        data.get(name)
            .map(|b| String::from_utf8_lossy(&b.0).into_owned())
    };
    let pem =
        text(IMAGE_SIGNING_KEY).ok_or_else(|| format!("{shown} has no {IMAGE_SIGNING_KEY}"))?;
    let password = text(IMAGE_SIGNING_PASSWORD);
    let key = tokio::task::spawn_blocking(move || {
        SignKey::from_pem_with_password(&pem, password.as_deref())
    })
    .await
    .map_err(|e| format!("reading the key of {shown}: {e}"))?
    .map_err(|e| match e {
        // The password is the Secret's, not an environment variable's.
        KeyError::NeedsPassword | KeyError::WrongPassword => format!(
            "the {IMAGE_SIGNING_KEY} of {shown} is encrypted and its {IMAGE_SIGNING_PASSWORD} \
             does not open it"
        ),
        e => format!("the {IMAGE_SIGNING_KEY} of {shown}: {e}"),
    })?;
    // What it signs must verify with the public key the controller checks images with. (Read
    // as strictly as that check reads it: the rebase's own check then uses this one, read in
    // the same reconcile, rather than the Secret again.)
    let published = data.get(IMAGE_VERIFY_KEY);
    if let Some(public) = published {
        let public = super::super::lookup::verify_key(&public.0)
            .map_err(|e| format!("the {IMAGE_VERIFY_KEY} of {shown}: {e}"))?;
        if public != *key.public() {
            return Err(format!(
                "the {IMAGE_SIGNING_KEY} of {shown} is not the private half of its \
                 {IMAGE_VERIFY_KEY}"
            ));
        }
    }
    let key = Arc::new(key);
    let published = published.is_some();
    let mut kept = ctx.signing_keys.0.lock().unwrap_or_else(|e| e.into_inner());
    *kept = Some((version, key.clone(), published));
    Ok(Some(Signing {
        key,
        started,
        published,
    }))
}
