//! `kiln dev`: edit, save, and the Function answers with the change. It builds the Function
//! into the local store as `kiln build` does, serves it on `--port` through a small TCP
//! proxy, watches the directory (inotify, through `notify`), and on every save builds again
//! and swaps the new Function in behind the proxy once it accepts connections. Until then,
//! and after a failed build, the last good one keeps answering.
//!
//! A source-only change unpacks no image: the sandbox restarts on the root filesystem it
//! has (base and dependencies, unpacked once) with the new source layer's files bound over
//! the source directory, and the dependency directory bound back in where it lies below it.
//! The process must restart in any case, since Node.js and Python keep the modules they
//! loaded; unpacking each new image instead would unpack the base again on every save. A
//! change to the dependencies installs them (with the step view) and unpacks the new image.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow};
use clap::Args;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

use super::Failure;
use super::build::BuildArgs;
use crate::build::{Options, Target};
use crate::oci::{Descriptor, Digest};
use crate::progress::steps;
use crate::registry::Client;
use crate::run::{ImageRef, Selector};
use crate::sandbox::{Bind, Signal};

/// Flags of `kiln dev`.
#[derive(Debug, Args)]
#[command(after_help = "\
On every save kiln builds again (a source-only change takes tens of milliseconds: the \
dependency layer comes from the cache) and starts the new Function beside the old one; the \
proxy on --port switches to it once it listens, and the old one stops. A failed build is \
shown and the last good Function keeps answering. Files under node_modules, .git and \
__pycache__ do not trigger a build.

The Function runs as `kiln run` runs it: in a rootless sandbox sharing the host network, \
on a port of its own behind the proxy.

Examples:
  kiln dev ./hello --runtime nodejs22 --port 8080
  kiln dev --runtime python313 -e LOG_LEVEL=debug")]
pub struct DevArgs {
    /// The Function's directory [default: the current directory].
    #[arg(value_name = "DIR")]
    pub dir: Option<PathBuf>,
    /// The runtime, as for `kiln build`.
    #[arg(long, env = "KILN_RUNTIME")]
    pub runtime: Option<String>,
    /// Where the Function answers: http://127.0.0.1:PORT.
    #[arg(
        long,
        short = 'p',
        default_value_t = 8080,
        value_parser = clap::value_parser!(u16).range(1..)
    )]
    pub port: u16,
    /// Set an environment variable for the Function, over the image's Env; repeatable.
    #[arg(long = "env", short = 'e', value_name = "KEY=VALUE")]
    pub env: Vec<String>,
    /// Build on this base image instead of the runtime's own, as `kiln build --base`.
    #[arg(long, value_name = "REF")]
    pub base: Option<String>,
    /// Install dependencies in this builder image, as `kiln build --builder-image`.
    #[arg(long, value_name = "REF")]
    pub builder_image: Option<String>,
    /// Cache directory [default: $XDG_CACHE_HOME/kiln or ~/.cache/kiln].
    #[arg(long, value_name = "DIR", env = "KILN_CACHE_DIR")]
    pub cache_dir: Option<PathBuf>,
}

/// How long a save's events may keep coming before the build starts: an editor's save is
/// several (a temporary file, a rename, the attributes).
const SETTLE: Duration = Duration::from_millis(15);
/// How long the old Function keeps running once the new one answers.
const DRAIN: Duration = Duration::from_millis(500);
/// How long a new Function has to listen on its port.
const READY: Duration = Duration::from_secs(30);

/// Runs the loop until Ctrl-C.
pub(super) async fn run(args: DevArgs) -> Result<String, Failure> {
    let dir = args.dir.clone().unwrap_or_else(|| PathBuf::from("."));
    let env = super::run::env_vars(&args.env).map_err(Failure::Usage)?;
    let build = build_args(&args, &dir).map_err(|e| Failure::Usage(e.into()))?;
    let (client, opts) = super::build::for_dev(&build).await?;
    let Target::Layout { dir: layout, .. } = opts.target.clone() else {
        return Err(Failure::Usage(anyhow!(
            "kiln dev builds into the local store"
        )));
    };
    let listener = TcpListener::bind(("127.0.0.1", args.port))
        .await
        .map_err(|e| {
            Failure::Usage(anyhow!(
                "--port {}: cannot listen on it ({e}); pass another --port",
                args.port
            ))
        })?;
    let backend = Arc::new(AtomicU16::new(0));
    tokio::spawn(proxy(listener, backend.clone()));
    let (tx, mut changes) = mpsc::unbounded_channel();
    let _watcher = watch(&dir, tx).map_err(Failure::Usage)?;
    let mut dev = Dev {
        client,
        opts,
        layout,
        env,
        backend,
        root: None,
        serving: None,
    };
    dev.cycle().await;
    steps::print(&format!(
        "kiln dev: watching {}; the Function answers on http://127.0.0.1:{} (Ctrl-C stops)",
        dir.display(),
        args.port
    ));
    loop {
        tokio::select! {
            change = changes.recv() => {
                if change.is_none() {
                    break;
                }
                tokio::time::sleep(SETTLE).await;
                while changes.try_recv().is_ok() {}
                dev.cycle().await;
            }
            status = dev.exited() => {
                dev.serving = None;
                dev.backend.store(0, Ordering::Release);
                steps::print(&format!(
                    "kiln dev: the Function exited ({status}); it starts again on the next save"
                ));
            }
            _ = tokio::signal::ctrl_c() => break,
        }
    }
    if let Some(serving) = dev.serving.take() {
        serving.stop().await;
    }
    Ok(String::new())
}

/// `kiln build DIR --runtime R` with the flags `kiln dev` passes on, into the local store.
fn build_args(args: &DevArgs, dir: &Path) -> Result<BuildArgs, clap::Error> {
    let mut line: Vec<std::ffi::OsString> = vec![dir.into()];
    let flags = [
        ("--runtime", args.runtime.as_ref().map(Into::into)),
        ("--base", args.base.as_ref().map(Into::into)),
        (
            "--builder-image",
            args.builder_image.as_ref().map(Into::into),
        ),
        ("--cache-dir", args.cache_dir.as_ref().map(|d| d.into())),
    ];
    for (flag, value) in flags {
        if let Some(value) = value {
            line.extend([flag.into(), value]);
        }
    }
    super::build::parse_flags(line)
}

/// The loop's state.
struct Dev {
    client: Client,
    opts: Options,
    /// The local store the builds go to.
    layout: PathBuf,
    /// `--env`.
    env: Vec<(String, String)>,
    /// The port the proxy forwards to; 0 while nothing serves.
    backend: Arc<AtomicU16>,
    /// The unpacked image the Function runs on.
    root: Option<Root>,
    serving: Option<Serving>,
}

/// An unpacked image, and its layers but the source layer: a build with the same ones
/// differs from it only in its source.
struct Root {
    entry: crate::run::Entry,
    lower: Vec<Digest>,
}

/// A running Function.
struct Serving {
    child: tokio::process::Child,
    /// The image it is.
    digest: Digest,
    /// The source it runs with, when it is bound over the root's.
    _source: Option<SourceDir>,
}

impl Dev {
    /// Builds, and swaps the result in when it differs from what serves; says what happened.
    async fn cycle(&mut self) {
        let began = Instant::now();
        match self.rebuild().await {
            Ok(Some(digest)) => steps::print(&format!(
                "kiln dev: {} answers, {} after the change",
                steps::short_digest(&digest),
                steps::duration(began.elapsed())
            )),
            Ok(None) => steps::print("kiln dev: the build is the one answering"),
            Err(e) => {
                steps::print(&format!("error: {e:#}"));
                if self.serving.is_some() {
                    steps::print("kiln dev: the last good build keeps answering");
                }
            }
        }
    }

    async fn rebuild(&mut self) -> anyhow::Result<Option<Digest>> {
        let output = crate::build::run(&self.client, &self.opts).await?;
        let digest = output.published.digest;
        if self.serving.as_ref().is_some_and(|s| s.digest == digest) {
            return Ok(None);
        }
        let layers = manifest_layers(&self.layout, &digest)?;
        let (source, lower) = layers
            .split_last()
            .ok_or_else(|| anyhow!("the image {digest} has no layers"))?;
        let lower: Vec<Digest> = lower.iter().map(|d| d.digest.clone()).collect();
        let source = match &self.root {
            Some(root) if root.lower == lower => Some(self.source_dir(root, source).await?),
            _ => {
                let image = ImageRef::Layout {
                    dir: self.layout.clone(),
                    selector: Selector::Digest(digest.clone()),
                };
                let step = steps::Step::start("unpack image");
                let entry = crate::run::prepare(&self.client, &self.run_options(image, 0)).await?;
                step.done(steps::short_digest(&entry.digest));
                self.root = Some(Root { entry, lower });
                None
            }
        };
        let serving = self.start(digest.clone(), source).await?;
        if let Some(old) = self.serving.replace(serving) {
            // Connections the proxy handed to the old one a moment ago are answered first.
            tokio::spawn(async move {
                tokio::time::sleep(DRAIN).await;
                old.stop().await;
            });
        }
        Ok(Some(digest))
    }

    fn run_options(&self, image: ImageRef, port: u16) -> crate::run::Options {
        let mut env = self.env.clone();
        env.push(("FUNC_PORT".into(), port.to_string()));
        crate::run::Options {
            image,
            platform: self.opts.platform.clone(),
            cache_dir: self.opts.cache_dir.clone(),
            env,
            args: None,
            entrypoint: None,
            user: None,
            jobs: self.opts.jobs,
            max_unpacked: crate::run::unpack::DEFAULT_LIMIT,
        }
    }

    /// The source layer `source` unpacked into a directory of its own, with a mount point
    /// for the root's dependency directory where that lies below the source directory.
    async fn source_dir(&self, root: &Root, source: &Descriptor) -> anyhow::Result<SourceDir> {
        let tmp = self.opts.cache_dir.join("tmp");
        std::fs::create_dir_all(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
        let dir = tempfile::Builder::new()
            .prefix("dev-source-")
            .tempdir_in(&tmp)
            .with_context(|| format!("creating a directory in {}", tmp.display()))?;
        let blob = crate::oci::Layout::open(&self.layout)?.blob_path(&source.digest);
        let runtime = &self.opts.runtime;
        let (src, deps) = (runtime.source.dir.clone(), runtime.dependencies.dir.clone());
        let deps_below = Some(deps).filter(|d| Path::new(d).starts_with(&src) && d != &src);
        let (root_fs, expected) = (root.entry.rootfs.clone(), source.digest.clone());
        let path = dir.path().to_path_buf();
        tokio::task::spawn_blocking(move || -> anyhow::Result<SourceDir> {
            let mut unpacker = crate::run::unpack::Unpacker::new(&path);
            let file = std::fs::File::open(&blob)
                .with_context(|| format!("opening the source layer {}", blob.display()))?;
            let applied = unpacker.apply(file)?;
            if applied.digest != expected {
                return Err(anyhow!(
                    "the source layer {} reads as {}",
                    expected,
                    applied.digest
                ));
            }
            let inside = |p: &str| p.trim_start_matches('/').to_string();
            let mut binds = vec![Bind::read_only(path.join(inside(&src)), src.clone())];
            if let Some(deps) = deps_below
                && root_fs.join(inside(&deps)).is_dir()
            {
                let mount_point = path.join(inside(&deps));
                std::fs::create_dir_all(&mount_point)
                    .with_context(|| format!("creating {}", mount_point.display()))?;
                binds.push(Bind::read_only(root_fs.join(inside(&deps)), deps));
            }
            unpacker.finish()?;
            Ok(SourceDir { dir, binds })
        })
        .await?
    }

    /// Starts the image on the root (with `source` bound over its own) on a free port, and
    /// waits until it listens there.
    async fn start(&self, digest: Digest, source: Option<SourceDir>) -> anyhow::Result<Serving> {
        let root = self
            .root
            .as_ref()
            .ok_or_else(|| anyhow!("no image unpacked"))?;
        let port = free_port()?;
        let binds = source.as_ref().map(|s| s.binds.clone()).unwrap_or_default();
        let opts = self.run_options(ImageRef::Registry(dummy_reference()?), port);
        let launch =
            crate::run::process::plan(&root.entry.rootfs, &root.entry.config, &opts, &binds)?;
        let step = steps::Step::start("start");
        let mut child = launch
            .sandbox
            .command(&launch.argv)?
            .spawn()
            .context("starting the Function's sandbox")?;
        let deadline = Instant::now() + READY;
        loop {
            if let Some(status) = child.try_wait()? {
                return Err(anyhow!("the Function exited ({status}) before it listened"));
            }
            if TcpStream::connect(("127.0.0.1", port)).await.is_ok() {
                break;
            }
            if Instant::now() > deadline {
                return Err(anyhow!(
                    "the Function did not listen on its port (FUNC_PORT={port}) within {}s",
                    READY.as_secs()
                ));
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        self.backend.store(port, Ordering::Release);
        step.done(format_args!(
            "listening on its port {port}, behind the proxy"
        ));
        Ok(Serving {
            child,
            digest,
            _source: source,
        })
    }

    /// When the serving Function exits by itself; never while none serves.
    async fn exited(&mut self) -> String {
        match &mut self.serving {
            Some(serving) => match serving.child.wait().await {
                Ok(status) => status.to_string(),
                Err(e) => e.to_string(),
            },
            None => std::future::pending().await,
        }
    }
}

impl Serving {
    /// SIGTERM to the Function, SIGKILL if it is still there a second later.
    async fn stop(mut self) {
        if let Some(pid) = self.child.id() {
            let _ = crate::sandbox::forward_signal(pid, Signal::Terminate);
        }
        if tokio::time::timeout(Duration::from_secs(1), self.child.wait())
            .await
            .is_err()
        {
            let _ = self.child.kill().await;
        }
    }
}

/// A source layer unpacked for a Function to run with, and the binds that put it in place;
/// removed when dropped.
struct SourceDir {
    dir: tempfile::TempDir,
    binds: Vec<Bind>,
}

impl Drop for SourceDir {
    fn drop(&mut self) {
        // The layer's directory modes may forbid removing what is in them.
        let _ = crate::run::unpack::make_writable(self.dir.path());
    }
}

/// The run options name an image; the launch plan does not read it.
fn dummy_reference() -> anyhow::Result<crate::registry::Reference> {
    Ok("localhost/kiln-dev".parse()?)
}

/// A port nothing listens on now.
fn free_port() -> anyhow::Result<u16> {
    let listener = std::net::TcpListener::bind(("127.0.0.1", 0)).context("finding a free port")?;
    Ok(listener.local_addr()?.port())
}

/// The layers of the manifest `digest` in the layout (read and checked against its digest).
fn manifest_layers(layout: &Path, digest: &Digest) -> anyhow::Result<Vec<Descriptor>> {
    let bytes = crate::oci::Layout::open(layout)?.read_blob(digest)?;
    let manifest: crate::oci::Manifest =
        serde_json::from_slice(&bytes).with_context(|| format!("reading the manifest {digest}"))?;
    Ok(manifest.layers)
}

/// Forwards each connection to the port in `backend`; while none serves, answers 503.
async fn proxy(listener: TcpListener, backend: Arc<AtomicU16>) {
    loop {
        let Ok((mut client, _)) = listener.accept().await else {
            continue;
        };
        let port = backend.load(Ordering::Acquire);
        tokio::spawn(async move {
            let _ = client.set_nodelay(true);
            let upstream = match port {
                0 => None,
                port => TcpStream::connect(("127.0.0.1", port)).await.ok(),
            };
            match upstream {
                Some(mut upstream) => {
                    let _ = upstream.set_nodelay(true);
                    let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
                }
                None => {
                    let body = "kiln dev: no build answers yet; see the terminal\n";
                    let answer = format!(
                        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain\r\n\
                         content-length: {}\r\nconnection: close\r\n\r\n{body}",
                        body.len()
                    );
                    let _ = client.write_all(answer.as_bytes()).await;
                }
            }
        });
    }
}

/// Watches `dir` (recursively) and sends on `tx` for every change that could change the
/// build: not under node_modules, .git or __pycache__, and not a mere read.
fn watch(dir: &Path, tx: mpsc::UnboundedSender<()>) -> anyhow::Result<notify::RecommendedWatcher> {
    use notify::{EventKind, RecursiveMode, Watcher};
    let ignored = |p: &Path| {
        p.components().any(|c| {
            matches!(
                c.as_os_str().to_str(),
                Some("node_modules" | ".git" | "__pycache__")
            )
        })
    };
    let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        if let Ok(event) = event
            && matches!(
                event.kind,
                EventKind::Create(_) | EventKind::Modify(_) | EventKind::Remove(_)
            )
            && event.paths.iter().any(|p| !ignored(p))
        {
            let _ = tx.send(());
        }
    })
    .context("starting the file watcher (inotify)")?;
    watcher
        .watch(dir, RecursiveMode::Recursive)
        .with_context(|| format!("watching {}", dir.display()))?;
    Ok(watcher)
}
