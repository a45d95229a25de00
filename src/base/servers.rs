//! The function servers, compiled into the binary so base images can be built anywhere.

/// `runtimes/_servers/<name>/…` by name.
const SERVERS: &[(&str, &str)] = &[
    (
        "node",
        include_str!("../../runtimes/_servers/node/server.js"),
    ),
    (
        "python",
        include_str!("../../runtimes/_servers/python/server.py"),
    ),
];

/// The source of server `name`.
pub fn source(name: &str) -> Option<&'static str> {
    SERVERS.iter().find(|(n, _)| *n == name).map(|(_, s)| *s)
}
