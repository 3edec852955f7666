//! The part of an OCI runtime spec (a bundle's config.json) that says which
//! pod a sandbox is (its annotations), its network namespace and its
//! resolv.conf.
use std::{collections::HashMap, path::Path};

use anyhow::{bail, Context as _, Result};
use serde::Deserialize;

/// Runtime specs are a few KiB; anything this large is not one.
pub const MAX_SPEC_BYTES: u64 = 4 << 20;

#[derive(Deserialize, Debug)]
pub struct Spec {
    #[serde(default)]
    annotations: HashMap<String, String>,
    linux: Option<Linux>,
    #[serde(default)]
    mounts: Vec<Mount>,
}

#[derive(Deserialize, Debug)]
struct Mount {
    destination: String,
    source: Option<String>,
}

#[derive(Deserialize, Debug)]
struct Linux {
    #[serde(default)]
    namespaces: Vec<Namespace>,
}

#[derive(Deserialize, Debug)]
struct Namespace {
    #[serde(rename = "type")]
    kind: String,
    path: Option<String>,
}

impl Spec {
    pub fn read(path: &Path) -> Result<Self> {
        let text = super::read_capped(path, MAX_SPEC_BYTES)?;
        serde_json::from_str(&text)
            .with_context(|| format!("{} is not an OCI runtime spec", path.display()))
    }

    pub fn annotation(&self, key: &str) -> Option<&str> {
        self.annotations
            .get(key)
            .map(String::as_str)
            .filter(|v| !v.is_empty())
    }

    /// One value per field, each the first of its keys that is set; an
    /// error line naming every field that has none.
    pub fn fields<const N: usize>(&self, fields: [&[&str]; N]) -> Result<[String; N]> {
        let mut missing = Vec::new();
        let values = fields.map(|keys| match keys.iter().find_map(|k| self.annotation(k)) {
            Some(value) => value.to_owned(),
            None => {
                missing.push(keys.join(" or "));
                String::new()
            }
        });
        if !missing.is_empty() {
            let noun = if missing.len() == 1 {
                "annotation"
            } else {
                "annotations"
            };
            bail!("missing {noun} {}", missing.join(", "));
        }
        Ok(values)
    }

    /// The host file bind-mounted as the container's /etc/resolv.conf.
    pub fn resolv_conf_source(&self) -> Option<&Path> {
        self.mounts
            .iter()
            .find(|m| m.destination == "/etc/resolv.conf")?
            .source
            .as_deref()
            .filter(|s| !s.is_empty())
            .map(Path::new)
    }

    /// The path of the network namespace the spec joins, if it names one
    /// (none: a new namespace, or the node's for a host-network pod).
    pub fn netns_path(&self) -> Option<&Path> {
        self.linux
            .as_ref()?
            .namespaces
            .iter()
            .find(|ns| ns.kind == "network")?
            .path
            .as_deref()
            .filter(|p| !p.is_empty())
            .map(Path::new)
    }
}
