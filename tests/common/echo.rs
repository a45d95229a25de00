//! A loopback HTTP stand-in for the services a Function calls: Kyma's eventing publisher proxy,
//! an echo service, an OTLP/HTTP trace receiver. It records every request and answers
//! `{"accepted":N}`.

use serde_json::Value;

/// A stand-in for Kyma's eventing publisher proxy: answers every POST with `{"accepted":N}`
/// and records each request's Content-Type and JSON body.
pub struct Publisher {
    pub url: String,
    seen: std::sync::Arc<std::sync::Mutex<Vec<(String, Value)>>>,
    requests: std::sync::Arc<std::sync::Mutex<Vec<Seen>>>,
}

/// A request a [`Publisher`] received: path, headers (lower-case names) and body.
#[derive(Clone, Debug)]
pub struct Seen {
    pub path: String,
    pub headers: std::collections::BTreeMap<String, String>,
    pub body: Vec<u8>,
}

impl Publisher {
    pub fn start() -> Publisher {
        use std::io::{BufRead, BufReader, Read, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/publish", listener.local_addr().unwrap());
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let requests = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let record = seen.clone();
        let record_all = requests.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { return };
                let mut reader = BufReader::new(stream.try_clone().unwrap());
                let (mut length, mut content_type) = (0, String::new());
                let mut request_line = String::new();
                let _ = reader.read_line(&mut request_line);
                let mut headers = std::collections::BTreeMap::new();
                loop {
                    let mut line = String::new();
                    if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                        break;
                    }
                    if let Some((name, value)) = line.split_once(':') {
                        headers.insert(name.trim().to_ascii_lowercase(), value.trim().to_string());
                    }
                    let lower = line.to_ascii_lowercase();
                    if let Some(v) = lower.strip_prefix("content-length:") {
                        length = v.trim().parse().unwrap_or(0);
                    }
                    if lower.starts_with("content-type:") {
                        content_type = line["content-type:".len()..].trim().to_string();
                    }
                }
                let mut body = vec![0; length];
                reader.read_exact(&mut body).unwrap();
                if headers
                    .get("transfer-encoding")
                    .is_some_and(|t| t.contains("chunked"))
                {
                    loop {
                        let mut size = String::new();
                        reader.read_line(&mut size).unwrap();
                        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
                        let mut chunk = vec![0; n + 2];
                        reader.read_exact(&mut chunk).unwrap();
                        if n == 0 {
                            break;
                        }
                        body.extend_from_slice(&chunk[..n]);
                    }
                }
                record_all.lock().unwrap().push(Seen {
                    path: request_line
                        .split_whitespace()
                        .nth(1)
                        .unwrap_or("")
                        .to_string(),
                    headers,
                    body: body.clone(),
                });
                let mut seen = record.lock().unwrap();
                seen.push((
                    content_type,
                    serde_json::from_slice(&body).unwrap_or(Value::Null),
                ));
                let answer = format!("{{\"accepted\":{}}}", seen.len());
                let _ = write!(
                    stream,
                    "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: \
                        {}\r\nConnection: close\r\n\r\n{answer}",
                    answer.len()
                );
            }
        });
        Publisher {
            url,
            seen,
            requests,
        }
    }

    pub fn seen(&self) -> Vec<(String, Value)> {
        self.seen.lock().unwrap().clone()
    }

    /// Where it listens, without a path.
    pub fn base(&self) -> &str {
        self.url.trim_end_matches("/publish")
    }

    pub fn requests(&self) -> Vec<Seen> {
        self.requests.lock().unwrap().clone()
    }

    /// The request it received on `path`.
    pub fn request(&self, path: &str) -> Seen {
        self.requests()
            .into_iter()
            .find(|r| r.path == path)
            .unwrap_or_else(|| panic!("no request for {path}: {:?}", self.requests()))
    }
}

/// A span as an OTLP/HTTP receiver sees it: name and ids in lower-case hex (no parent: "").
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Span {
    pub name: String,
    pub trace_id: String,
    pub span_id: String,
    pub parent_id: String,
}

/// The spans of every OTLP/HTTP export request `receiver` got, whether OTLP/JSON (ids in hex)
/// or OTLP/protobuf (`TracesData`: resource_spans=1 → scope_spans=2 → spans=2; a span's
/// trace_id=1, span_id=2, parent_span_id=4, name=5).
pub fn exported_spans(receiver: &Publisher) -> Vec<Span> {
    let mut spans = Vec::new();
    for r in receiver.requests() {
        let json_body = r
            .headers
            .get("content-type")
            .is_some_and(|t| t.starts_with("application/json"));
        if json_body {
            let doc: Value = serde_json::from_slice(&r.body).unwrap_or(Value::Null);
            for rs in doc["resourceSpans"].as_array().into_iter().flatten() {
                for ss in rs["scopeSpans"].as_array().into_iter().flatten() {
                    for s in ss["spans"].as_array().into_iter().flatten() {
                        let id = |k: &str| s[k].as_str().unwrap_or("").to_ascii_lowercase();
                        spans.push(Span {
                            name: s["name"].as_str().unwrap_or("").to_string(),
                            trace_id: id("traceId"),
                            span_id: id("spanId"),
                            parent_id: id("parentSpanId"),
                        });
                    }
                }
            }
        } else {
            for rs in fields(&r.body, 1) {
                for ss in fields(rs, 2) {
                    for s in fields(ss, 2) {
                        let one = |n: u64| fields(s, n).first().map(|b| hex(b)).unwrap_or_default();
                        spans.push(Span {
                            name: String::from_utf8_lossy(
                                fields(s, 5).first().copied().unwrap_or(&[]),
                            )
                            .into_owned(),
                            trace_id: one(1),
                            span_id: one(2),
                            parent_id: one(4),
                        });
                    }
                }
            }
        }
    }
    spans
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The length-delimited fields numbered `number` of a protobuf message.
fn fields(msg: &[u8], number: u64) -> Vec<&[u8]> {
    fn varint(buf: &[u8], at: &mut usize) -> Option<u64> {
        let mut value = 0u64;
        for shift in (0..64).step_by(7) {
            let byte = *buf.get(*at)?;
            *at += 1;
            value |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Some(value);
            }
        }
        None
    }
    let (mut out, mut at) = (Vec::new(), 0);
    while at < msg.len() {
        let Some(key) = varint(msg, &mut at) else {
            break;
        };
        match key & 7 {
            0 => {
                if varint(msg, &mut at).is_none() {
                    break;
                }
            }
            1 => at += 8,
            5 => at += 4,
            2 => {
                let Some(len) = varint(msg, &mut at) else {
                    break;
                };
                let end = at + len as usize;
                if end > msg.len() {
                    break;
                }
                if key >> 3 == number {
                    out.push(&msg[at..end]);
                }
                at = end;
            }
            _ => break,
        }
    }
    out
}
