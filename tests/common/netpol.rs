//! NetworkPolicy semantics (networking.k8s.io/v1, as the Kubernetes documentation defines
//! them and CNIs enforce them), to check what deploy/'s policies allow: no CNI runs here, so
//! nothing enforces them. A pod is isolated for a direction once a policy of its namespace
//! selects it with that policy type; an isolated pod's connection is allowed when a rule of
//! one of those policies matches the peer and the port. Peers are pods (namespace, labels, IP)
//! or addresses outside the cluster; `ipBlock`s match either by IP.

use std::collections::BTreeMap;
use std::net::IpAddr;

use serde_json::Value;

/// One end of a connection.
#[derive(Clone, Debug)]
pub enum Peer {
    /// A pod: its namespace, labels and IP.
    Pod {
        /// Namespace.
        namespace: String,
        /// Labels.
        labels: BTreeMap<String, String>,
        /// IP.
        ip: IpAddr,
    },
    /// An address outside the cluster.
    External(IpAddr),
}

impl Peer {
    /// A pod.
    pub fn pod(namespace: &str, labels: &[(&str, &str)], ip: &str) -> Peer {
        Peer::Pod {
            namespace: namespace.into(),
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ip: ip.parse().expect("an IP"),
        }
    }

    /// An address outside the cluster.
    pub fn external(ip: &str) -> Peer {
        Peer::External(ip.parse().expect("an IP"))
    }

    fn ip(&self) -> IpAddr {
        match self {
            Peer::Pod { ip, .. } | Peer::External(ip) => *ip,
        }
    }
}

/// The policies and the namespaces' labels.
pub struct Cluster {
    policies: Vec<Value>,
    namespaces: BTreeMap<String, BTreeMap<String, String>>,
}

impl Cluster {
    /// `policies` (NetworkPolicy objects) in a cluster whose namespaces have `labels` (each
    /// also gets `kubernetes.io/metadata.name`, as the API server sets it).
    pub fn new(policies: Vec<Value>, namespaces: &[(&str, &[(&str, &str)])]) -> Cluster {
        let namespaces = namespaces
            .iter()
            .map(|(name, labels)| {
                let mut l: BTreeMap<String, String> = labels
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect();
                l.insert("kubernetes.io/metadata.name".into(), name.to_string());
                (name.to_string(), l)
            })
            .collect();
        Cluster {
            policies,
            namespaces,
        }
    }

    /// Whether `from` may open a connection to `to` on `port`/`protocol`: `from`'s egress
    /// and `to`'s ingress must both allow it.
    pub fn allows(&self, from: &Peer, to: &Peer, port: u16, protocol: &str) -> bool {
        self.direction(from, to, port, protocol, "Egress")
            && self.direction(to, from, port, protocol, "Ingress")
    }

    /// Whether `pod`'s policies of `kind` (`Egress`: to `other`; `Ingress`: from it) allow it.
    fn direction(&self, pod: &Peer, other: &Peer, port: u16, protocol: &str, kind: &str) -> bool {
        let Peer::Pod {
            namespace, labels, ..
        } = pod
        else {
            return true;
        };
        let selecting: Vec<&Value> = self
            .policies
            .iter()
            .filter(|p| p["metadata"]["namespace"] == namespace.as_str())
            .filter(|p| selects(&p["spec"]["podSelector"], labels))
            .filter(|p| policy_types(p).contains(&kind))
            .collect();
        if selecting.is_empty() {
            return true;
        }
        let (rules, peers) = match kind {
            "Egress" => ("egress", "to"),
            _ => ("ingress", "from"),
        };
        selecting.iter().any(|p| {
            p["spec"][rules]
                .as_array()
                .into_iter()
                .flatten()
                .any(|rule| {
                    self.peers_match(&rule[peers], namespace, other)
                        && ports_match(&rule["ports"], port, protocol)
                })
        })
    }

    fn peers_match(&self, peers: &Value, policy_namespace: &str, other: &Peer) -> bool {
        let Some(list) = peers.as_array().filter(|l| !l.is_empty()) else {
            return true;
        };
        list.iter().any(|peer| {
            if let Some(block) = peer.get("ipBlock") {
                return in_block(block, other.ip());
            }
            let Peer::Pod {
                namespace, labels, ..
            } = other
            else {
                return false;
            };
            let namespace_ok = match peer.get("namespaceSelector") {
                Some(selector) => {
                    let empty = BTreeMap::new();
                    let ns_labels = self.namespaces.get(namespace).unwrap_or(&empty);
                    selects(selector, ns_labels)
                }
                None => namespace == policy_namespace,
            };
            let pod_ok = peer
                .get("podSelector")
                .is_none_or(|selector| selects(selector, labels));
            namespace_ok && pod_ok
        })
    }
}

/// `spec.policyTypes`, or what the API server defaults it to.
fn policy_types(p: &Value) -> Vec<&str> {
    match p["spec"]["policyTypes"].as_array() {
        Some(types) => types.iter().filter_map(Value::as_str).collect(),
        None if p["spec"]["egress"].is_array() => vec!["Ingress", "Egress"],
        None => vec!["Ingress"],
    }
}

/// A label selector (`matchLabels`, `matchExpressions`); `{}` selects everything.
pub fn selects(selector: &Value, labels: &BTreeMap<String, String>) -> bool {
    let labels_ok = selector["matchLabels"]
        .as_object()
        .into_iter()
        .flatten()
        .all(|(k, v)| labels.get(k).map(String::as_str) == v.as_str());
    let expressions_ok = selector["matchExpressions"]
        .as_array()
        .into_iter()
        .flatten()
        .all(|e| {
            let key = e["key"].as_str().unwrap_or_default();
            let values: Vec<&str> = e["values"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .collect();
            let value = labels.get(key).map(String::as_str);
            match e["operator"].as_str() {
                Some("In") => value.is_some_and(|v| values.contains(&v)),
                Some("NotIn") => value.is_none_or(|v| !values.contains(&v)),
                Some("Exists") => value.is_some(),
                Some("DoesNotExist") => value.is_none(),
                _ => false,
            }
        });
    labels_ok && expressions_ok
}

fn ports_match(ports: &Value, port: u16, protocol: &str) -> bool {
    let Some(list) = ports.as_array().filter(|l| !l.is_empty()) else {
        return true;
    };
    list.iter().any(|p| {
        let proto = p["protocol"].as_str().unwrap_or("TCP");
        let Some(first) = p["port"].as_u64() else {
            // No port (or a named one, which no pod here has): every port of the protocol.
            return proto == protocol && p["port"].is_null();
        };
        let last = p["endPort"].as_u64().unwrap_or(first);
        proto == protocol && (first..=last).contains(&u64::from(port))
    })
}

fn in_block(block: &Value, ip: IpAddr) -> bool {
    let inside = |cidr: &str| {
        let (net, bits) = cidr.split_once('/').expect("a CIDR");
        let (net, bits): (IpAddr, u32) = (net.parse().expect("an IP"), bits.parse().expect("bits"));
        match (net, ip) {
            (IpAddr::V4(n), IpAddr::V4(a)) => {
                let mask = u32::MAX.checked_shl(32 - bits).unwrap_or(0);
                u32::from(n) & mask == u32::from(a) & mask
            }
            (IpAddr::V6(n), IpAddr::V6(a)) => {
                let mask = u128::MAX.checked_shl(128 - bits).unwrap_or(0);
                u128::from(n) & mask == u128::from(a) & mask
            }
            _ => false,
        }
    };
    let cidr = block["cidr"].as_str().unwrap_or_default();
    inside(cidr)
        && !block["except"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .any(inside)
}
