//! The function servers, compiled into the binary so base images can be built anywhere.

/// A function server of `runtimes/_servers/`: its main file, which goes to the recipe's
/// `server_dest`, and the files it loads from beside it (paths relative to that file's
/// directory).
pub struct Server {
    /// The server's entry file.
    pub main: &'static str,
    /// `(relative path, contents)` of the files beside it.
    pub beside: &'static [(&'static str, &'static str)],
}

/// The legacy `main(event, context)` server, also the new-API server's shared core.
const NODE: &str = include_str!("../../runtimes/_servers/node/server.js");
/// The legacy `main(event, context)` Python server, also the Flask server's shared core.
const PYTHON: &str = include_str!("../../runtimes/_servers/python/server.py");

/// `runtimes/_servers/<name>/…` by name.
const SERVERS: &[(&str, Server)] = &[
    (
        "node",
        Server {
            main: NODE,
            beside: &[],
        },
    ),
    (
        "express",
        Server {
            main: include_str!("../../runtimes/_servers/express/server.js"),
            beside: &[
                ("kiln-core.js", NODE),
                (
                    "node_modules/sdk/index.js",
                    include_str!("../../runtimes/_servers/express/sdk/index.js"),
                ),
                (
                    "node_modules/sdk/package.json",
                    include_str!("../../runtimes/_servers/express/sdk/package.json"),
                ),
            ],
        },
    ),
    (
        "python",
        Server {
            main: PYTHON,
            beside: &[],
        },
    ),
    (
        "flask",
        Server {
            main: include_str!("../../runtimes/_servers/flask/server.py"),
            beside: &[
                ("kiln_core.py", PYTHON),
                (
                    "sdk.py",
                    include_str!("../../runtimes/_servers/flask/sdk.py"),
                ),
            ],
        },
    ),
];

/// Server `name`.
pub fn server(name: &str) -> Option<&'static Server> {
    SERVERS.iter().find(|(n, _)| *n == name).map(|(_, s)| s)
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_recipes_server_exists() {
        for (runtime, _, _) in crate::runtime::table::BASE_IMAGES {
            let (recipe, _) = crate::base::recipe::embedded(runtime).unwrap();
            assert!(
                super::server(&recipe.image.server).is_some(),
                "{runtime}: no server {:?}",
                recipe.image.server
            );
        }
    }
}
