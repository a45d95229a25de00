//! The dependency install's only way out of its sandbox: an HTTP proxy that admits the package
//! registries and nothing else. The install runs in a private network namespace (loopback
//! only, [`crate::sandbox::gate`]); kiln listens on that loopback and serves `CONNECT
//! host:port` (HTTPS) and absolute-form requests (`GET http://host/…`) here, on the host's
//! network, for the hosts of the runtime's default registries and of the registries the
//! install's `.npmrc`/`pip.conf` name. Everything else gets `403`, and so does a registry
//! host that resolves to a loopback, link-local (cloud metadata), unspecified or multicast
//! address, or to a cloud metadata service elsewhere ([`METADATA`]). Private ranges are
//! allowed: private registries live there. An upstream proxy from the environment
//! (`https_proxy`, `http_proxy`, `no_proxy`) is used for the allowed connections, as the
//! install would have used it.

use std::net::IpAddr;
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::function::NamedBytes;

/// The largest request head read before a connection is refused.
const MAX_HEAD: usize = 16 * 1024;

/// Who may be reached.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Policy {
    /// Allowed `(host, port)` pairs, hosts lowercase.
    hosts: Vec<(String, u16)>,
    /// The upstream proxy for HTTPS (`CONNECT`) and plain HTTP, from the environment.
    https_upstream: Option<(String, u16)>,
    http_upstream: Option<(String, u16)>,
    /// `no_proxy` entries: host suffixes that bypass the upstream.
    no_proxy: Vec<String>,
}

impl Policy {
    /// The registries of `defaults` (URLs) and those named in `configs` (`.npmrc`:
    /// `registry=` and `@scope:registry=`; `pip.conf`: `index-url`, `extra-index-url`,
    /// `find-links`), with the upstream proxy from `proxy_env`.
    pub fn for_install(
        defaults: &[String],
        configs: &[NamedBytes],
        proxy_env: &[(String, String)],
    ) -> Policy {
        let mut policy = Policy::default();
        let mut urls: Vec<String> = defaults.to_vec();
        for config in configs {
            let text = String::from_utf8_lossy(&config.bytes);
            for line in text.lines() {
                let line = line.trim();
                let Some((key, value)) = line
                    .split_once(['=', ':'])
                    .filter(|_| !line.starts_with(['#', ';', '[']))
                else {
                    continue;
                };
                let key = key.trim().to_ascii_lowercase();
                let registry_key = key == "registry"
                    || key.ends_with(":registry")
                    || matches!(key.as_str(), "index-url" | "extra-index-url" | "find-links");
                // `@scope:registry=URL` splits at the first ':'.
                let value = if key.starts_with('@') && value.starts_with("registry") {
                    value.split_once('=').map_or("", |(_, v)| v)
                } else if registry_key {
                    value
                } else {
                    continue;
                };
                urls.extend(value.split_whitespace().map(str::to_string));
            }
        }
        for url in urls {
            if let Some(host) = host_port(&url)
                && !policy.hosts.contains(&host)
            {
                policy.hosts.push(host);
            }
        }
        for (key, value) in proxy_env {
            match key.to_ascii_lowercase().as_str() {
                "https_proxy" => policy.https_upstream = host_port(value),
                "http_proxy" => policy.http_upstream = host_port(value),
                "no_proxy" => {
                    policy.no_proxy = value
                        .split(',')
                        .map(|s| s.trim().trim_start_matches('.').to_ascii_lowercase())
                        .filter(|s| !s.is_empty())
                        .collect();
                }
                _ => {}
            }
        }
        policy
    }

    /// The allowed hosts, for messages.
    pub fn hosts(&self) -> impl Iterator<Item = String> + '_ {
        self.hosts.iter().map(|(h, p)| format!("{h}:{p}"))
    }

    fn allows(&self, host: &str, port: u16) -> bool {
        let host = host.to_ascii_lowercase();
        self.hosts.iter().any(|(h, p)| *h == host && *p == port)
    }

    fn upstream(&self, host: &str, tls: bool) -> Option<&(String, u16)> {
        let bypass = self
            .no_proxy
            .iter()
            .any(|suffix| suffix == "*" || host == suffix || host.ends_with(&format!(".{suffix}")));
        if bypass {
            return None;
        }
        if tls {
            self.https_upstream.as_ref()
        } else {
            self.http_upstream.as_ref()
        }
    }
}

/// `(host, port)` of a URL (`scheme://[user@]host[:port]/…`), host lowercase.
fn host_port(url: &str) -> Option<(String, u16)> {
    let url = url::Url::parse(url.trim()).ok()?;
    let host = url
        .host_str()?
        .trim_matches(['[', ']'])
        .to_ascii_lowercase();
    Some((host, url.port_or_known_default()?))
}

/// Serves `listener` until the task is dropped: each connection gets [`handle`].
pub async fn serve(listener: std::net::TcpListener, policy: Arc<Policy>) -> std::io::Result<()> {
    listener.set_nonblocking(true)?;
    let listener = tokio::net::TcpListener::from_std(listener)?;
    loop {
        let (conn, _) = listener.accept().await?;
        let policy = policy.clone();
        tokio::spawn(async move {
            if let Err(e) = handle(conn, &policy).await {
                tracing::debug!(error = %e, "install proxy connection");
            }
        });
    }
}

/// One proxied connection.
async fn handle(mut client: TcpStream, policy: &Policy) -> std::io::Result<()> {
    let (head, rest) = read_head(&mut client).await?;
    let line = head.lines().next().unwrap_or_default().to_string();
    let mut parts = line.split_whitespace();
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let connect = method.eq_ignore_ascii_case("CONNECT");
    let destination = if connect {
        target.rsplit_once(':').and_then(|(h, p)| {
            Some((
                h.trim_matches(['[', ']']).to_ascii_lowercase(),
                p.parse().ok()?,
            ))
        })
    } else {
        target
            .starts_with("http://")
            .then(|| host_port(target))
            .flatten()
    };
    let Some((host, port)) = destination else {
        return refuse(
            &mut client,
            "400 Bad Request",
            &format!("{line:?} is not a proxy request"),
        )
        .await;
    };
    if !policy.allows(&host, port) {
        tracing::warn!(
            %host,
            port,
            "the install tried to reach a host that is not a package registry; refused",
        );
        let why = format!("{host}:{port} is not a package registry this install may reach");
        return refuse(&mut client, "403 Forbidden", &why).await;
    }
    let mut server = match dial(policy, &host, port, connect).await {
        Ok(server) => server,
        Err(why) => {
            tracing::warn!(%host, port, %why, "install proxy refused");
            return refuse(&mut client, "403 Forbidden", &why).await;
        }
    };
    if connect {
        client
            .write_all(b"HTTP/1.1 200 Connection Established\r\n\r\n")
            .await?;
    } else {
        server.write_all(head.as_bytes()).await?;
    }
    server.write_all(&rest).await?;
    tokio::io::copy_bidirectional(&mut client, &mut server).await?;
    Ok(())
}

/// Connects to an allowed destination, directly (refusing addresses no registry has) or
/// through the upstream proxy (a tunnel for `CONNECT`; plain HTTP goes to it as is).
async fn dial(policy: &Policy, host: &str, port: u16, tls: bool) -> Result<TcpStream, String> {
    if let Some((proxy, proxy_port)) = policy.upstream(host, tls) {
        let mut stream = TcpStream::connect((proxy.as_str(), *proxy_port))
            .await
            .map_err(|e| format!("connecting to the upstream proxy {proxy}:{proxy_port}: {e}"))?;
        if tls {
            let request = format!("CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n");
            stream
                .write_all(request.as_bytes())
                .await
                .map_err(|e| e.to_string())?;
            let (head, _) = read_head(&mut stream).await.map_err(|e| e.to_string())?;
            let status = head.split_whitespace().nth(1).unwrap_or("");
            if status != "200" {
                return Err(format!(
                    "the upstream proxy answered {status} for {host}:{port}"
                ));
            }
        }
        return Ok(stream);
    }
    let addrs: Vec<_> = tokio::net::lookup_host((host, port))
        .await
        .map_err(|e| format!("resolving {host}: {e}"))?
        .collect();
    if let Some(bad) = addrs.iter().find(|a| !reachable(a.ip())) {
        return Err(format!(
            "{host} resolves to {}, which no package registry may be at (loopback, link-local, \
             unspecified, multicast, or a cloud metadata service)",
            bad.ip()
        ));
    }
    TcpStream::connect(&addrs[..])
        .await
        .map_err(|e| format!("connecting to {host}:{port}: {e}"))
}

/// Cloud metadata and host-agent services outside the link-local range: Alibaba Cloud's
/// (100.100.100.200), Azure's WireServer (168.63.129.16), AWS's over IPv6 (fd00:ec2::254).
/// Private ranges as such stay reachable: a private registry (Verdaccio, a devpi in the
/// cluster) is named by a private address.
const METADATA: [IpAddr; 3] = [
    IpAddr::V4(std::net::Ipv4Addr::new(100, 100, 100, 200)),
    IpAddr::V4(std::net::Ipv4Addr::new(168, 63, 129, 16)),
    IpAddr::V6(std::net::Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254)),
];

/// Whether an install may connect to `ip`.
fn reachable(ip: IpAddr) -> bool {
    let ip = match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
        v4 => v4,
    };
    if METADATA.contains(&ip) {
        return false;
    }
    match ip {
        IpAddr::V4(v4) => {
            !(v4.is_loopback()
                || v4.is_link_local()
                || v4.is_unspecified()
                || v4.is_multicast()
                || v4.is_broadcast())
        }
        IpAddr::V6(v6) => {
            !(v6.is_loopback()
                || v6.is_unspecified()
                || v6.is_multicast()
                || v6.is_unicast_link_local())
        }
    }
}

/// Reads up to the end of the request (or response) head; returns it and what came after.
async fn read_head(stream: &mut TcpStream) -> std::io::Result<(String, Vec<u8>)> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 2048];
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let rest = buf.split_off(end + 4);
            return Ok((String::from_utf8_lossy(&buf).into_owned(), rest));
        }
        if buf.len() > MAX_HEAD {
            return Err(std::io::Error::other("request head too large"));
        }
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

async fn refuse(client: &mut TcpStream, status: &str, why: &str) -> std::io::Result<()> {
    let body = format!("kiln: {why}\n");
    let response = format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: \
            close\r\n\r\n{body}",
        body.len()
    );
    client.write_all(response.as_bytes()).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(name: &str, text: &str) -> NamedBytes {
        NamedBytes {
            name: name.into(),
            bytes: text.as_bytes().to_vec(),
        }
    }

    #[test]
    fn registries_come_from_the_defaults_and_the_configs_only() {
        let policy = Policy::for_install(
            &["https://registry.npmjs.org/".into()],
            &[
                config(
                    ".npmrc",
                    "registry=https://npm.corp.example/repo/\n@acme:registry=https://acme.example:\
                        8443/\n\
                     //npm.corp.example/:_authToken=secret\nproxy=http://evil.example/\n",
                ),
                config(
                    "pip.conf",
                    "[global]\nindex-url = https://pypi.corp.example/simple\n\
                     extra-index-url = https://a.example/simple http://b.example:8080/simple\n",
                ),
            ],
            &[("https_proxy".into(), "http://proxy.corp:3128".into())],
        );
        let hosts: Vec<String> = policy.hosts().collect();
        assert_eq!(
            hosts,
            [
                "registry.npmjs.org:443",
                "npm.corp.example:443",
                "acme.example:8443",
                "pypi.corp.example:443",
                "a.example:443",
                "b.example:8080"
            ]
        );
        assert!(policy.allows("Registry.NPMJS.org", 443));
        assert!(!policy.allows("registry.npmjs.org", 80));
        assert!(!policy.allows("evil.example", 80));
        assert_eq!(
            policy.upstream("registry.npmjs.org", true),
            Some(&("proxy.corp".to_string(), 3128))
        );
    }

    #[test]
    fn loopback_link_local_and_unspecified_addresses_are_unreachable() {
        for bad in [
            "127.0.0.1",
            "169.254.169.254",
            "0.0.0.0",
            "::1",
            "fe80::1",
            "::ffff:127.0.0.1",
            "224.0.0.1",
            "100.100.100.200",
            "168.63.129.16",
            "fd00:ec2::254",
            "::ffff:100.100.100.200",
        ] {
            assert!(!reachable(bad.parse().unwrap()), "{bad}");
        }
        for good in ["104.16.0.35", "2606:4700::6810:1", "10.0.0.5"] {
            assert!(reachable(good.parse().unwrap()), "{good}");
        }
    }
}
