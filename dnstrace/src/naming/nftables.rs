//! Services from kube-proxy's nftables mode: `nft -j list table ip
//! kube-proxy` (and `ip6`). The `service-ips` map sends `IP . proto . port`
//! to a `service-HASH-ns/name/proto/port` chain, which picks an
//! `endpoint-…` chain that does `dnat to`. Shapes it does not know are
//! skipped: a newer kube-proxy may write more.
use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
};

use serde_json::Value;

use super::{Proto, ServicePort};

/// How many chains deep a service's endpoints are looked for.
const MAX_DEPTH: usize = 4;

/// The service ports in one table's JSON listing; none where it is not one.
pub fn parse(json: &str) -> Vec<ServicePort> {
    let Ok(doc) = serde_json::from_str::<Value>(json) else {
        return Vec::new();
    };
    let Some(items) = doc.get("nftables").and_then(Value::as_array) else {
        return Vec::new();
    };
    let chains = Chains::of(items);
    items
        .iter()
        .filter_map(|item| item.get("map"))
        .filter(|map| map.get("name").and_then(Value::as_str) == Some("service-ips"))
        .filter_map(|map| map.get("elem").and_then(Value::as_array))
        .flatten()
        .filter_map(|elem| service_port(elem, &chains))
        .collect()
}

/// One `service-ips` element: `[{"concat": [ip, proto, port]}, {"goto": …}]`
/// (the key wrapped in `{"elem": {"val": …}}` where it has a comment).
fn service_port(elem: &Value, chains: &Chains) -> Option<ServicePort> {
    let [key, verdict] = elem.as_array()?.as_slice() else {
        return None;
    };
    let key = key.pointer("/elem/val").unwrap_or(key);
    let [ip, proto, port] = key.get("concat")?.as_array()?.as_slice() else {
        return None;
    };
    let chain = targets(verdict).into_iter().next()?;
    Some(ServicePort {
        ip: ip.as_str()?.parse().ok()?,
        port: u16::try_from(port.as_u64()?).ok()?,
        proto: Proto::parse(proto.as_str()?)?,
        name: service_name(chain),
        endpoints: chains.dnat_from(chain),
    })
}

/// `ns/name` from `service-HASH-ns/name/proto/port` (or `external-…`).
fn service_name(chain: &str) -> Option<String> {
    let (_, base) = chain.split_once('-')?;
    let (_, path) = base.split_once('-')?;
    let mut parts = path.splitn(3, '/');
    Some(format!("{}/{}", parts.next()?, parts.next()?))
}

/// What each chain jumps to and where it DNATs.
#[derive(Default)]
struct Chains<'a> {
    jumps: BTreeMap<&'a str, Vec<&'a str>>,
    dnat: BTreeMap<&'a str, Vec<IpAddr>>,
}

impl<'a> Chains<'a> {
    fn of(items: &'a [Value]) -> Self {
        let mut c = Self::default();
        for rule in items.iter().filter_map(|i| i.get("rule")) {
            let (Some(chain), Some(exprs)) = (
                rule.get("chain").and_then(Value::as_str),
                rule.get("expr").and_then(Value::as_array),
            ) else {
                continue;
            };
            for expr in exprs {
                c.jumps.entry(chain).or_default().extend(targets(expr));
                let addr = expr.pointer("/dnat/addr").and_then(Value::as_str);
                if let Some(ip) = addr.and_then(|a| a.parse().ok()) {
                    c.dnat.entry(chain).or_default().push(ip);
                }
            }
        }
        c
    }

    /// The DNAT addresses reachable from `chain`, in order, once each.
    fn dnat_from(&self, chain: &str) -> Vec<IpAddr> {
        let mut seen = BTreeSet::new();
        let mut out = Vec::new();
        self.walk(chain, MAX_DEPTH, &mut seen, &mut out);
        out
    }

    fn walk(&self, chain: &str, depth: usize, seen: &mut BTreeSet<IpAddr>, out: &mut Vec<IpAddr>) {
        for ip in self.dnat.get(chain).into_iter().flatten() {
            if seen.insert(*ip) {
                out.push(*ip);
            }
        }
        if depth == 0 {
            return;
        }
        for next in self.jumps.get(chain).into_iter().flatten() {
            self.walk(next, depth - 1, seen, out);
        }
    }
}

/// Every `goto`/`jump` target anywhere in an expression (vmaps included).
fn targets(v: &Value) -> Vec<&str> {
    let mut out = Vec::new();
    collect_targets(v, &mut out);
    out
}

fn collect_targets<'a>(v: &'a Value, out: &mut Vec<&'a str>) {
    match v {
        Value::Object(map) => {
            for (key, inner) in map {
                let target = inner.get("target").and_then(Value::as_str);
                match (key.as_str(), target) {
                    ("goto" | "jump", Some(t)) => out.push(t),
                    _ => collect_targets(inner, out),
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|i| collect_targets(i, out)),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn kube_dns_and_its_endpoints_come_from_the_service_ips_map() {
        let ports = parse(include_str!("fixtures/nft-ip-kube-proxy.json"));
        let udp = ports.iter().find(|p| p.proto == Proto::Udp).unwrap();
        assert_eq!((udp.ip, udp.port), (ip("10.96.0.10"), 53));
        assert_eq!(udp.name.as_deref(), Some("kube-system/kube-dns"));
        assert_eq!(udp.endpoints, [ip("10.244.0.53"), ip("10.244.0.54")]);
        assert_eq!(ports.len(), 2, "udp and tcp");
    }

    #[test]
    fn ipv6_tables_and_a_service_chain_that_dnats_itself() {
        let ports = parse(include_str!("fixtures/nft-ip6-kube-proxy.json"));
        assert_eq!(ports[0].ip, ip("fd00:10:96::a"));
        assert_eq!(ports[0].endpoints, [ip("fd00:10:244::35")]);
        assert_eq!(ports[1].name.as_deref(), Some("default/kubernetes"));
        assert_eq!((ports[1].port, ports[1].endpoints[0]), (443, ip("fd00::1")));
    }

    #[test]
    fn unknown_shapes_are_skipped() {
        assert!(parse("").is_empty());
        assert!(parse("{\"nftables\": 3}").is_empty());
        let odd = r#"{"nftables": [{"map": {"name": "service-ips", "elem": [
            [{"concat": ["10.96.0.10", "udp"]}, {"goto": {"target": "x"}}],
            [{"concat": ["nope", "udp", 53]}, {"goto": {"target": "x"}}],
            [{"elem": {"val": {"concat": ["10.96.0.11", "udp", 53]}, "comment": "c"}},
             {"goto": {"target": "service-X-a/b/udp/dns"}}],
            7]}}, {"rule": {"chain": "service-X-a/b/udp/dns", "expr": [{"dnat": {"addr": {"map": 1}}}]}}]}"#;
        let ports = parse(odd);
        assert_eq!(ports.len(), 1);
        assert_eq!(ports[0].ip, ip("10.96.0.11"));
        assert!(ports[0].endpoints.is_empty());
    }
}
