//! What a flood may cost GitLab: the comment commands accepted per merge request (and per
//! author on it) each minute, and the wrong job tokens a client may present each minute before
//! planbot stops asking GitLab about its tokens. In memory, per replica.

use crate::core::config::IpNet;
use crate::core::ids::{MrIid, ProjectId, UserId};
use axum::http::HeaderMap;
use std::collections::HashMap;
use std::hash::Hash;
use std::net::{IpAddr, SocketAddr};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The window every limit here counts in.
pub const WINDOW: Duration = Duration::from_secs(60);
/// Comment commands (`planbot …`) accepted on one merge request per [`WINDOW`], all authors.
pub const COMMANDS_PER_MR: u32 = 12;
/// Comment commands accepted from one author on one merge request per [`WINDOW`].
pub const COMMANDS_PER_AUTHOR: u32 = 8;
/// Wrong job tokens one client may present per [`WINDOW`] (each cost a `GET /job`); past it
/// the widgets and apply endpoints answer 429 without asking GitLab, until the window ends.
pub const WRONG_TOKENS_PER_CLIENT: u32 = 10;
/// Keys a limit remembers at most (the expired ones are dropped first, then the oldest).
const KEPT: usize = 10_000;

/// A count per key in fixed windows of [`WINDOW`].
#[derive(Debug)]
pub struct WindowLimit<K> {
    limit: u32,
    counts: Mutex<HashMap<K, (Instant, u32)>>,
}

impl<K: Hash + Eq + Clone> WindowLimit<K> {
    pub fn new(limit: u32) -> Self {
        WindowLimit {
            limit,
            counts: Mutex::new(HashMap::new()),
        }
    }

    /// Count one for `key` if it is under the limit (`true`), else count nothing (`false`).
    pub fn take(&self, key: &K, now: Instant) -> bool {
        let mut counts = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        Self::forget_old(&mut *counts, now);
        let entry = counts.entry(key.clone()).or_insert((now, 0));
        if now.duration_since(entry.0) >= WINDOW {
            *entry = (now, 0);
        }
        if entry.1 >= self.limit {
            return false;
        }
        entry.1 += 1;
        true
    }

    /// Count one for `key`, over the limit or not.
    pub fn add(&self, key: &K, now: Instant) {
        let mut counts = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        Self::forget_old(&mut *counts, now);
        let entry = counts.entry(key.clone()).or_insert((now, 0));
        if now.duration_since(entry.0) >= WINDOW {
            *entry = (now, 0);
        }
        entry.1 = entry.1.saturating_add(1);
    }

    /// `Some(wait)` while `key` is at its limit: how long until its window ends.
    pub fn blocked(&self, key: &K, now: Instant) -> Option<Duration> {
        let counts = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        let (start, n) = counts.get(key)?;
        let age = now.duration_since(*start);
        (age < WINDOW && *n >= self.limit).then(|| WINDOW - age)
    }

    fn forget_old(counts: &mut HashMap<K, (Instant, u32)>, now: Instant) {
        if counts.len() < KEPT {
            return;
        }
        counts.retain(|_, (start, _)| now.duration_since(*start) < WINDOW);
        while counts.len() >= KEPT {
            let oldest = counts
                .iter()
                .min_by_key(|(_, (s, _))| *s)
                .map(|(k, _)| k.clone());
            match oldest {
                Some(k) => counts.remove(&k),
                None => break,
            };
        }
    }
}

/// The limits one process holds.
#[derive(Debug)]
pub struct Limits {
    per_mr: WindowLimit<(ProjectId, MrIid)>,
    per_author: WindowLimit<(ProjectId, MrIid, UserId)>,
    wrong_tokens: WindowLimit<IpAddr>,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            per_mr: WindowLimit::new(COMMANDS_PER_MR),
            per_author: WindowLimit::new(COMMANDS_PER_AUTHOR),
            wrong_tokens: WindowLimit::new(WRONG_TOKENS_PER_CLIENT),
        }
    }
}

impl Limits {
    /// Whether a comment command of `author` on the MR is accepted now (and counted).
    pub fn command(&self, project: ProjectId, mr: MrIid, author: UserId) -> bool {
        let now = Instant::now();
        if self
            .per_author
            .blocked(&(project, mr, author), now)
            .is_some()
        {
            return false;
        }
        self.per_mr.take(&(project, mr), now) && self.per_author.take(&(project, mr, author), now)
    }

    /// `Some(retry after)` while `client` is over its wrong job tokens.
    pub fn wrong_tokens_blocked(&self, client: IpAddr) -> Option<Duration> {
        self.wrong_tokens.blocked(&client, Instant::now())
    }

    /// `client` presented a job token GitLab refused.
    pub fn wrong_token(&self, client: IpAddr) {
        self.wrong_tokens.add(&client, Instant::now());
    }
}

/// The client of a request: its peer's address, or, when the peer is one of
/// `server.trusted_proxies`, the address `X-Forwarded-For` names before the trusted proxies
/// (read from the right; the first address not a trusted proxy is the client).
pub fn client(peer: Option<SocketAddr>, headers: &HeaderMap, trusted: &[IpNet]) -> IpAddr {
    let peer = peer.map_or(IpAddr::from([0, 0, 0, 0]), |p| p.ip().to_canonical());
    let is_trusted = |ip: IpAddr| trusted.iter().any(|net| net.contains(ip));
    if !is_trusted(peer) {
        return peer;
    }
    let mut client = peer;
    let forwarded = headers
        .get_all("x-forwarded-for")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .collect::<Vec<_>>();
    for hop in forwarded.into_iter().rev() {
        let Ok(ip) = hop.parse::<IpAddr>() else {
            break; // a hop that is not an address: believe nothing further left
        };
        client = ip.to_canonical();
        if !is_trusted(client) {
            break;
        }
    }
    client
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_window_counts_to_its_limit_then_refuses_until_it_ends() {
        let limit = WindowLimit::new(2);
        let t0 = Instant::now();
        assert!(limit.take(&1, t0));
        assert!(limit.take(&1, t0));
        assert!(!limit.take(&1, t0 + Duration::from_secs(59)));
        assert!(limit.take(&2, t0));
        assert_eq!(
            limit.blocked(&1, t0 + Duration::from_secs(50)),
            Some(Duration::from_secs(10))
        );
        assert!(limit.take(&1, t0 + WINDOW));
        assert_eq!(limit.blocked(&1, t0 + WINDOW), None);
    }

    #[test]
    fn forwarded_for_is_believed_only_from_a_trusted_proxy() {
        let trusted = [IpNet::parse("10.0.0.0/8").unwrap()];
        let mut h = HeaderMap::new();
        h.insert(
            "x-forwarded-for",
            "6.6.6.6, 198.51.100.7, 10.1.1.1".parse().unwrap(),
        );
        let proxy: SocketAddr = "10.0.0.5:4000".parse().unwrap();
        let direct: SocketAddr = "203.0.113.9:4000".parse().unwrap();
        // Through the proxy: the first hop from the right that is not a trusted proxy.
        assert_eq!(
            client(Some(proxy), &h, &trusted),
            "198.51.100.7".parse::<IpAddr>().unwrap()
        );
        // Straight from a client: its header is not believed.
        assert_eq!(
            client(Some(direct), &h, &trusted),
            "203.0.113.9".parse::<IpAddr>().unwrap()
        );
        // No proxy listed: every client is its peer.
        assert_eq!(
            client(Some(proxy), &h, &[]),
            "10.0.0.5".parse::<IpAddr>().unwrap()
        );
    }

    #[test]
    fn ip_ranges_parse_and_contain() {
        let net = IpNet::parse("192.168.0.0/16").unwrap();
        assert!(net.contains("192.168.4.2".parse().unwrap()));
        assert!(net.contains("::ffff:192.168.4.2".parse().unwrap()));
        assert!(!net.contains("192.169.0.1".parse().unwrap()));
        assert!(IpNet::parse("fd00::/8")
            .unwrap()
            .contains("fd12::1".parse().unwrap()));
        assert!(IpNet::parse("192.168.1.0/16").is_err());
        assert!(IpNet::parse("10.0.0.1/33").is_err());
        assert!(IpNet::parse("proxy.example").is_err());
        assert_eq!(
            format!("{:?}", IpNet::parse("10.0.0.5").unwrap()),
            "10.0.0.5"
        );
    }
}
