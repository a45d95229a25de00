//! `kiln init [DIR] --runtime RUNTIME`: a Function that builds and answers at once — the
//! handler of Kyma's templates for the runtime (the `(event, context)` API, or the
//! `(req, res)`/`main()` API of nodejs26 and python314), an empty dependency manifest, a
//! `.kilnignore`, and with `--manifest` a Kyma `Function` with the same inline source. It
//! never overwrites a file: if one of them exists, nothing is written.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, anyhow};
use clap::Args;

use super::Failure;
use crate::runtime::{Catalog, Language, RuntimeSpec};

/// Flags of `kiln init`.
#[derive(Debug, Args)]
#[command(after_help = "Examples:
  kiln init hello --runtime nodejs22 && kiln build hello --runtime nodejs22
  kiln init --runtime python313 --manifest      # also function.yaml, for kubectl apply -f

Prints the directory written. Refuses, writing nothing, when one of the files exists.")]
pub struct InitArgs {
    /// The Function's directory, made if missing.
    #[arg(value_name = "DIR", default_value = ".")]
    pub dir: PathBuf,
    /// The runtime the Function is written for (`kiln build --runtime`).
    #[arg(long, value_name = "RUNTIME")]
    pub runtime: String,
    /// Also write function.yaml: a Kyma `Function` (serverless.kyma-project.io/v1alpha2) with
    /// this source inline, for `kubectl apply -f` or `kiln build --function`.
    #[arg(long)]
    pub manifest: bool,
    /// The Function's name in function.yaml [default: the directory's name, if it is a
    /// valid one].
    #[arg(long, value_name = "NAME", requires = "manifest")]
    pub name: Option<String>,
}

/// What `.kilnignore` starts with.
const KILNIGNORE: &str = "\
# Files kiln leaves out of the image (gitignore syntax). node_modules/, .git/, .npmrc and
# pip.conf never enter it anyway.
.env
*.log
";

pub(super) fn run(args: &InitArgs) -> Result<String, Failure> {
    let catalog = Catalog::embedded();
    let (runtime, alias) = catalog
        .resolve(&args.runtime)
        .with_context(|| format!("--runtime {:?}", args.runtime))
        .map_err(Failure::Usage)?;
    if let Some(alias) = alias {
        tracing::warn!("{}", alias.warning(&catalog));
    }
    let (handler, dependencies) = template(runtime);
    let mut files = vec![
        (runtime.source.handler.clone(), handler.to_string()),
        (runtime.dependencies.manifest.clone(), dependencies),
        (".kilnignore".to_string(), KILNIGNORE.to_string()),
    ];
    if args.manifest {
        let name = function_name(args).map_err(Failure::Usage)?;
        let yaml =
            manifest(&name, &runtime.name, &files[0].1, &files[1].1).map_err(Failure::Build)?;
        files.push(("function.yaml".to_string(), yaml));
    }
    let existing: Vec<String> = files
        .iter()
        .map(|(name, _)| args.dir.join(name))
        .filter(|path| path.symlink_metadata().is_ok())
        .map(|path| path.display().to_string())
        .collect();
    if !existing.is_empty() {
        return Err(Failure::Usage(anyhow!(
            "kiln init writes no file that exists, and {} does: remove it or choose another \
             directory",
            existing.join(", ")
        )));
    }
    std::fs::create_dir_all(&args.dir)
        .with_context(|| format!("creating {}", args.dir.display()))
        .map_err(Failure::Build)?;
    for (name, text) in &files {
        write_new(&args.dir.join(name), text).map_err(Failure::Build)?;
    }
    let dir = args.dir.display();
    tracing::info!(
        files = %files.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>().join(", "),
        "wrote a {} Function: build it with `kiln build {dir} --runtime {}`, then serve what \
         that prints with `kiln run REF --port 8080`",
        runtime.description,
        args.runtime,
    );
    Ok(args.dir.display().to_string())
}

/// Creates `path` with `text`; a file that appeared meanwhile is not overwritten.
fn write_new(path: &Path, text: &str) -> anyhow::Result<()> {
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
        .with_context(|| format!("creating {}", path.display()))?;
    file.write_all(text.as_bytes())
        .with_context(|| format!("writing {}", path.display()))
}

/// The Function's name: `--name`, else the directory's (made absolute) when it is a valid one.
fn function_name(args: &InitArgs) -> anyhow::Result<String> {
    let name = match &args.name {
        Some(name) => name.clone(),
        None => std::path::absolute(&args.dir)
            .ok()
            .and_then(|d| d.file_name().map(|n| n.to_string_lossy().into_owned()))
            .unwrap_or_default(),
    };
    crate::k8s_names::dns1035_label(&name).map_err(|e| {
        anyhow!(
            "{name:?} cannot name a Function ({e}): pass --name NAME, lower-case letters, \
             digits and '-'"
        )
    })?;
    Ok(name)
}

/// The handler and the dependency manifest of Kyma's templates for `runtime`.
fn template(runtime: &RuntimeSpec) -> (&'static str, String) {
    // Kyma's new handler API: nodejs26 and python314.
    let new_api = matches!(runtime.name.as_str(), "nodejs26" | "python314");
    match (runtime.language, new_api) {
        (Language::Nodejs, false) => (NODE, NODE_PACKAGE.to_string()),
        (Language::Nodejs, true) => (NODE_NEW, NODE_PACKAGE.to_string()),
        (Language::Python, false) => (PYTHON, String::new()),
        (Language::Python, true) => (PYTHON_NEW, String::new()),
    }
}

const NODE: &str = "\
module.exports = {
  main: async function (event, context) {
    const message = `Hello World`
      + ` from the Kyma Function ${context['function-name']}`
      + ` running on ${context.runtime}!`;
    console.log(message);
    return message;
  }
}
";

const NODE_NEW: &str = "\
const { getFunctionName, getRuntime } = require('sdk');

module.exports = {
  main: async function (req, res) {
    const message = `Hello World`
      + ` from the Kyma Function ${getFunctionName()}`
      + ` running on ${getRuntime()}!`;
    console.log(message);
    res.send(message);
  }
}
";

const NODE_PACKAGE: &str = "{\n  \"dependencies\": {}\n}\n";

const PYTHON: &str = "\
def main(event, context):
    message = (
        \"Hello World from the Kyma Function \" + context['function-name']
        + \" running on \" + context['runtime'] + \"!\"
    )
    print(message)
    return message
";

const PYTHON_NEW: &str = "\
import sdk


def main():
    message = (
        \"Hello World from the Kyma Function \" + sdk.get_function_name()
        + \" running on \" + sdk.get_runtime() + \"!\"
    )
    print(message)
    return message
";

/// A Kyma `Function` named `name` on `runtime` with `source` and `dependencies` inline.
fn manifest(name: &str, runtime: &str, source: &str, dependencies: &str) -> anyhow::Result<String> {
    let mut inline = serde_json::json!({ "source": source });
    if !dependencies.trim().is_empty() {
        inline["dependencies"] = dependencies.into();
    }
    let function = serde_json::json!({
        "apiVersion": "serverless.kyma-project.io/v1alpha2",
        "kind": "Function",
        "metadata": { "name": name },
        "spec": { "runtime": runtime, "source": { "inline": inline } },
    });
    serde_yaml::to_string(&function).context("writing function.yaml")
}
