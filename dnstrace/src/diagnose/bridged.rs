//! Whether answers from a resolver to its client cross a Linux bridge on
//! this node: only then can br_netfilter's absence skip their reverse NAT.
use std::net::IpAddr;

use super::Context;
use crate::pods::net::Attachment;

/// The way between a client and a resolver, as far as the node's pods tell.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Way<'a> {
    /// Both pods' host veths are ports of `bridge`.
    Bridged {
        bridge: &'a str,
        client: IpAddr,
        resolver: IpAddr,
    },
    /// Not over one bridge: routed pods, or one of them elsewhere.
    NotBridged,
    /// The node's pods were not read.
    Unknown,
}

impl Way<'_> {
    /// `10.244.0.10 and the resolver 10.244.0.53 are ports of bridge cni0`.
    pub(super) fn evidence(&self) -> Option<String> {
        match self {
            Way::Bridged {
                bridge,
                client,
                resolver,
            } => Some(format!(
                "the host veths of {client} and of the resolver {resolver} are ports of bridge {bridge} on the node"
            )),
            _ => None,
        }
    }
}

/// The way between `client` and `resolver`.
pub(super) fn between(ctx: &Context, client: IpAddr, resolver: IpAddr) -> Way<'_> {
    if ctx.attachments.is_empty() {
        return Way::Unknown;
    }
    match (ctx.attachments.get(&client), ctx.attachments.get(&resolver)) {
        (Some(Attachment::Bridge(a)), Some(Attachment::Bridge(b))) if a == b => Way::Bridged {
            bridge: a,
            client,
            resolver,
        },
        _ => Way::NotBridged,
    }
}

/// A bridged way from some client (the target, or any other pod) to a
/// resolver on this node, if there is one.
pub(super) fn any_bridged(ctx: &Context) -> Way<'_> {
    if ctx.attachments.is_empty() {
        return Way::Unknown;
    }
    let clients: Vec<IpAddr> = match &ctx.target {
        Some(t) => t.addrs.clone(),
        None => ctx.attachments.keys().copied().collect(),
    };
    let pairs = ctx.resolvers.iter().flat_map(|&r| {
        clients
            .iter()
            .filter(|c| !ctx.resolvers.contains(c))
            .map(move |&c| (c, r))
    });
    pairs
        .map(|(c, r)| between(ctx, c, r))
        .find(|w| matches!(w, Way::Bridged { .. }))
        .unwrap_or(Way::NotBridged)
}
