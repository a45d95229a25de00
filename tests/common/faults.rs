//! A fault-injecting HTTP/1.1 proxy for the registry tests: it stands in front of the real
//! registry (kiln is pointed at the proxy's port) or serves as an `HTTP_PROXY`, forwards each
//! request on its own upstream connection, and by its rules answers some requests itself
//! (503, 429 with `Retry-After`, any status), resets the connection halfway through a request
//! body, or stalls. Every request is logged with what was done to it.
//!
//! One thread per client connection, one request per connection (`Connection: close` both
//! ways), so a fault never leaves a half-read request on a reused connection.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// A deterministic rule: given method, path and body length, a status to answer instead of
/// forwarding.
pub type Rule = Box<dyn FnMut(&str, &str, u64) -> Option<u16> + Send>;

/// What the proxy does to requests.
#[derive(Default)]
pub struct Faults {
    /// Fraction of requests (0..=1) answered with `status` instead of being forwarded.
    pub fail_rate: f64,
    /// The status of random failures (503 when 0).
    pub status: u16,
    /// `Retry-After` seconds sent with random failures.
    pub retry_after: Option<u32>,
    /// Every this many requests, one is answered 429 with `Retry-After: 1` (0: never).
    pub throttle_every: u32,
    /// This many requests with a body are cut off (connection reset) halfway through it.
    pub resets: u32,
    /// This many requests are read and then never answered, for `stall_for`.
    pub stalls: u32,
    /// How long a stalled request hangs before its connection is closed.
    pub stall_for: Duration,
    /// Extra delay before forwarding each request.
    pub delay: Duration,
    /// Checked first, for every request.
    pub rule: Option<Rule>,
    /// Refuse a Bearer token whose JWT `exp` has passed with 401 and this challenge (plus
    /// `error="invalid_token"`), as a registry without clock leeway would. (distribution
    /// allows 60 s of leeway, too long for a test.)
    pub expired_tokens: Option<String>,
}

/// One request the proxy saw.
#[derive(Clone, Debug)]
pub struct Seen {
    /// When it arrived (since the proxy started).
    pub at: Duration,
    /// `METHOD path?query`.
    pub request: String,
    /// `forwarded STATUS`, `answered STATUS`, `reset`, `stalled`.
    pub outcome: String,
}

struct State {
    upstream: SocketAddr,
    faults: Mutex<Faults>,
    seen: Mutex<Vec<Seen>>,
    rng: Mutex<u64>,
    started: Instant,
    count: Mutex<u64>,
    port: u16,
    stop: AtomicBool,
}

/// A running proxy; stops when dropped.
pub struct FaultProxy {
    state: Arc<State>,
}

impl FaultProxy {
    /// Starts a proxy in front of `upstream` (`127.0.0.1:PORT`).
    pub fn start(upstream: &str, faults: Faults) -> FaultProxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind fault proxy");
        let seed = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .expect("clock")
            .as_nanos() as u64;
        let state = Arc::new(State {
            upstream: upstream.parse().expect("upstream is 127.0.0.1:PORT"),
            faults: Mutex::new(faults),
            seen: Mutex::new(Vec::new()),
            rng: Mutex::new(seed | 1),
            started: Instant::now(),
            count: Mutex::new(0),
            port: listener.local_addr().expect("local addr").port(),
            stop: AtomicBool::new(false),
        });
        let st = state.clone();
        thread::spawn(move || {
            for conn in listener.incoming() {
                if st.stop.load(Ordering::Relaxed) {
                    return;
                }
                let Ok(conn) = conn else { continue };
                let st = st.clone();
                thread::spawn(move || {
                    let _ = serve(&st, conn);
                });
            }
        });
        FaultProxy { state }
    }

    /// `127.0.0.1:PORT` of the proxy.
    pub fn host(&self) -> String {
        format!("127.0.0.1:{}", self.state.port)
    }

    /// Replaces the faults.
    pub fn set(&self, faults: Faults) {
        *self.state.faults.lock().expect("faults") = faults;
    }

    /// Every request so far.
    pub fn seen(&self) -> Vec<Seen> {
        self.state.seen.lock().expect("seen").clone()
    }

    /// How many requests got a fault (anything but `forwarded`).
    pub fn faults_injected(&self) -> usize {
        self.seen()
            .iter()
            .filter(|s| !s.outcome.starts_with("forwarded"))
            .count()
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.state.stop.store(true, Ordering::Relaxed);
        // Wake the accept loop so it sees the flag.
        let _ = TcpStream::connect(("127.0.0.1", self.state.port));
    }
}

impl State {
    fn random(&self) -> f64 {
        let mut z = self.rng.lock().expect("rng");
        *z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut x = *z;
        x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        x ^= x >> 31;
        (x >> 11) as f64 / (1u64 << 53) as f64
    }

    fn record(&self, at: Duration, request: &str, outcome: String) {
        self.seen.lock().expect("seen").push(Seen {
            at,
            request: request.to_string(),
            outcome,
        });
    }
}

enum Action {
    Forward(Duration),
    Unauthorized(String),
    Answer(u16, Option<u32>),
    Reset,
    Stall(Duration),
}

struct Head {
    method: String,
    target: String,
    headers: Vec<(String, String)>,
    length: u64,
}

fn read_head(reader: &mut impl BufRead) -> std::io::Result<Option<Head>> {
    let mut line = String::new();
    if reader.read_line(&mut line)? == 0 {
        return Ok(None);
    }
    let mut parts = line.trim_end().splitn(3, ' ');
    let (method, target) = (
        parts.next().unwrap_or_default().to_string(),
        parts.next().unwrap_or_default().to_string(),
    );
    let mut headers = Vec::new();
    let mut length = 0;
    loop {
        let mut h = String::new();
        reader.read_line(&mut h)?;
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        let (k, v) = h.split_once(':').unwrap_or((h, ""));
        let (k, v) = (k.trim().to_string(), v.trim().to_string());
        if k.eq_ignore_ascii_case("content-length") {
            length = v.parse().unwrap_or(0);
        }
        assert!(
            !(k.eq_ignore_ascii_case("transfer-encoding") && v.contains("chunked")),
            "the fault proxy does not handle chunked request bodies ({method} {target})"
        );
        headers.push((k, v));
    }
    Ok(Some(Head {
        method,
        target,
        headers,
        length,
    }))
}

fn serve(st: &State, client: TcpStream) -> std::io::Result<()> {
    let at = st.started.elapsed();
    let mut reader = BufReader::new(client.try_clone()?);
    let Some(head) = read_head(&mut reader)? else {
        return Ok(());
    };
    // An HTTP_PROXY client sends the absolute form: keep only the path.
    let path = match head.target.split_once("://") {
        Some((_, rest)) => rest.find('/').map_or("/", |i| &rest[i..]).to_string(),
        None => head.target.clone(),
    };
    let request = format!("{} {path}", head.method);
    let action = {
        let mut f = st.faults.lock().expect("faults");
        let n = {
            let mut c = st.count.lock().expect("count");
            *c += 1;
            *c
        };
        let ruled = f
            .rule
            .as_mut()
            .and_then(|r| r(&head.method, &path, head.length));
        let expired = f
            .expired_tokens
            .clone()
            .filter(|_| bearer_expired(&head.headers));
        if let Some(challenge) = expired {
            Action::Unauthorized(challenge)
        } else if let Some(status) = ruled {
            Action::Answer(status, None)
        } else if f.throttle_every > 0 && n % u64::from(f.throttle_every) == 0 {
            Action::Answer(429, Some(1))
        } else if f.stalls > 0 {
            f.stalls -= 1;
            Action::Stall(f.stall_for)
        } else if f.resets > 0 && head.length > 1 {
            f.resets -= 1;
            Action::Reset
        } else if f.fail_rate > 0.0 && st.random() < f.fail_rate {
            let status = if f.status == 0 { 503 } else { f.status };
            Action::Answer(status, f.retry_after)
        } else {
            Action::Forward(f.delay)
        }
    };
    match action {
        Action::Reset => {
            let mut half = vec![0; usize::try_from(head.length / 2).unwrap_or(0)];
            reader.read_exact(&mut half)?;
            st.record(at, &request, "reset".into());
            // Unread data plus SO_LINGER 0: the kernel answers with RST.
            set_linger_zero(&client);
            drop(reader);
            drop(client);
            Ok(())
        }
        Action::Stall(d) => {
            discard(&mut reader, head.length)?;
            st.record(at, &request, "stalled".into());
            thread::sleep(d);
            let _ = client.shutdown(Shutdown::Both);
            Ok(())
        }
        Action::Answer(status, retry_after) => {
            discard(&mut reader, head.length)?;
            st.record(at, &request, format!("answered {status}"));
            let body = format!(
                "{{\"errors\":[{{\"code\":\"UNAVAILABLE\",\"message\":\"injected {status}\"}}]}}"
            );
            let mut out = format!(
                "HTTP/1.1 {status} Injected\r\nContent-Type: application/json\r\nContent-Length: \
                    {}\r\nConnection: close\r\n",
                body.len()
            );
            if let Some(secs) = retry_after {
                out.push_str(&format!("Retry-After: {secs}\r\n"));
            }
            out.push_str("\r\n");
            out.push_str(&body);
            let mut client = client;
            client.write_all(out.as_bytes())?;
            client.flush()
        }
        Action::Unauthorized(challenge) => {
            discard(&mut reader, head.length)?;
            st.record(at, &request, "answered 401 (expired token)".into());
            let body = r#"{"errors":[{"code":"UNAUTHORIZED","message":"token expired"}]}"#;
            let out = format!(
                "HTTP/1.1 401 Unauthorized\r\nContent-Type: application/json\r\nContent-Length: \
                    {}\r\nWWW-Authenticate: {challenge},error=\"invalid_token\"\r\nConnection: \
                    close\r\n\r\n{body}",
                body.len()
            );
            let mut client = client;
            client.write_all(out.as_bytes())?;
            client.flush()
        }
        Action::Forward(delay) => {
            thread::sleep(delay);
            // Recorded before the answer goes back: a client that has its answer finds its
            // request among what the proxy saw.
            let record = |outcome| st.record(at, &request, outcome);
            forward(st, &head, &path, &mut reader, client, record)
        }
    }
}

fn forward(
    st: &State,
    head: &Head,
    path: &str,
    reader: &mut BufReader<TcpStream>,
    mut client: TcpStream,
    record: impl FnOnce(String),
) -> std::io::Result<()> {
    let mut up = TcpStream::connect(st.upstream)?;
    let mut out = format!("{} {path} HTTP/1.1\r\n", head.method);
    for (k, v) in &head.headers {
        let hop = [
            "connection",
            "keep-alive",
            "proxy-connection",
            "proxy-authorization",
        ];
        if hop.iter().any(|h| k.eq_ignore_ascii_case(h)) {
            continue;
        }
        out.push_str(&format!("{k}: {v}\r\n"));
    }
    out.push_str("Connection: close\r\n\r\n");
    up.write_all(out.as_bytes())?;
    std::io::copy(&mut reader.take(head.length), &mut up)?;
    let mut upr = BufReader::new(up);
    let mut status_line = String::new();
    upr.read_line(&mut status_line)?;
    let status = status_line.split(' ').nth(1).unwrap_or("?").to_string();
    // The registry builds `Location` from the `Host` header, which is passed on as sent:
    // it names the proxy (kiln pointed at it) or the registry (through HTTP_PROXY).
    let mut resp = status_line;
    loop {
        let mut h = String::new();
        upr.read_line(&mut h)?;
        if h.trim_end().is_empty() {
            break;
        }
        let name = h.split(':').next().unwrap_or_default().to_ascii_lowercase();
        if name == "connection" || name == "keep-alive" {
            continue;
        }
        resp.push_str(&h);
    }
    resp.push_str("Connection: close\r\n\r\n");
    record(format!("forwarded {status}"));
    client.write_all(resp.as_bytes())?;
    std::io::copy(&mut upr, &mut client)?;
    client.flush()
}

/// Whether the request carries a Bearer JWT whose `exp` is in the past.
fn bearer_expired(headers: &[(String, String)]) -> bool {
    use base64::Engine as _;
    let Some((_, value)) = headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case("authorization"))
    else {
        return false;
    };
    let Some(jwt) = value.strip_prefix("Bearer ") else {
        return false;
    };
    let Some(payload) = jwt.split('.').nth(1) else {
        return false;
    };
    let Ok(bytes) = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(payload) else {
        return false;
    };
    let Ok(claims) = serde_json::from_slice::<serde_json::Value>(&bytes) else {
        return false;
    };
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock")
        .as_secs();
    claims["exp"].as_u64().is_some_and(|exp| exp <= now)
}

fn discard(reader: &mut impl Read, len: u64) -> std::io::Result<()> {
    std::io::copy(&mut reader.take(len), &mut std::io::sink()).map(|_| ())
}

fn set_linger_zero(stream: &TcpStream) {
    // std has no SO_LINGER setter; rustix (a kiln dependency) does.
    let _ = rustix::net::sockopt::set_socket_linger(stream, Some(Duration::ZERO));
}
