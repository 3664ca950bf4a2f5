//! Who may use the console, and what keeps another site from using it in
//! an operator's name: the service's authorization check, the token every
//! form carries, and the check of where an unsafe request comes from.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use hmac::{KeyInit, Mac};
use http::request::Parts;
use http::{HeaderMap, HeaderValue, Method, header};
use idem_core::InvalidInput;
use idem_core::store::{Clock, SystemClock, validate_name};

/// The operator an authorization check let in, as the service's check
/// names them (a user name, an e-mail, a service account): every action is
/// traced with it.
///
/// ```
/// use idem_admin::Operator;
///
/// let operator = Operator::new("jane@ops")?;
/// assert_eq!(operator.as_str(), "jane@ops");
/// assert!(Operator::new("").is_err());
/// # Ok::<(), idem_core::InvalidInput>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Operator(String);

impl Operator {
    /// An operator named `name`: 1 to 255 bytes, no control characters.
    ///
    /// # Errors
    ///
    /// [`InvalidInput`] for another name.
    pub fn new(name: impl Into<String>) -> Result<Self, InvalidInput> {
        let name = name.into();
        validate_name("operator", &name, 255, |_| true, "")?;
        Ok(Self(name))
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Operator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Why an authorization check refused a request.
///
/// ```
/// use http::HeaderValue;
/// use idem_admin::Refusal;
///
/// let refusal = Refusal::unauthenticated(Some(HeaderValue::from_static("Bearer")));
/// assert_eq!(refusal.status(), http::StatusCode::UNAUTHORIZED);
/// assert_eq!(Refusal::Forbidden.status(), http::StatusCode::FORBIDDEN);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Refusal {
    /// No credentials, or credentials that name nobody: 401, with the
    /// `WWW-Authenticate` challenge if given.
    Unauthenticated {
        /// The challenge (`Basic realm="ops"`, `Bearer`).
        challenge: Option<HeaderValue>,
    },
    /// Someone known who may not operate: 403.
    Forbidden,
}

impl Refusal {
    /// A 401 with `challenge`.
    pub fn unauthenticated(challenge: Option<HeaderValue>) -> Self {
        Self::Unauthenticated { challenge }
    }

    /// Its status.
    pub fn status(&self) -> http::StatusCode {
        match self {
            Self::Unauthenticated { .. } => http::StatusCode::UNAUTHORIZED,
            Self::Forbidden => http::StatusCode::FORBIDDEN,
        }
    }
}

/// A boxed future of an authorization check.
pub type Check<'a> = Pin<Box<dyn Future<Output = Result<Operator, Refusal>> + Send + 'a>>;

/// The service's authorization check: who is asking, from the request's
/// head (its headers, its extensions where a middleware of the service put
/// a session). Every route of the console runs it first; the console's
/// router cannot be built without one ([`Admin::authorize`](crate::Admin::authorize)).
///
/// A closure over the request's head is one:
///
/// ```
/// use http::request::Parts;
/// use idem_admin::{Operator, Refusal};
///
/// let check = |request: &Parts| match request.headers.get("x-ops-token") {
///     Some(token) if token == "s3cret" => Operator::new("ops").map_err(|_| Refusal::Forbidden),
///     Some(_) => Err(Refusal::Forbidden),
///     None => Err(Refusal::unauthenticated(None)),
/// };
/// # fn is_check(_: impl idem_admin::Authorize) {}
/// is_check(check);
/// ```
pub trait Authorize: Send + Sync + 'static {
    /// The operator `request` comes from, or why it is refused.
    fn authorize<'a>(&'a self, request: &'a Parts) -> Check<'a>;
}

impl<F> Authorize for F
where
    F: Fn(&Parts) -> Result<Operator, Refusal> + Send + Sync + 'static,
{
    fn authorize<'a>(&'a self, request: &'a Parts) -> Check<'a> {
        let answer = self(request);
        Box::pin(std::future::ready(answer))
    }
}

type HmacSha256 = hmac::Hmac<sha2::Sha256>;

/// How long a form's token is accepted after its page was served.
pub(crate) const TOKEN_LIFETIME: Duration = Duration::from_secs(12 * 3600);

/// The key of the cross-site request tokens: each form carries an
/// HMAC-SHA-256 of its operator's identity and the time the page was
/// served, which a page of another site can neither read nor make.
#[derive(Clone)]
pub(crate) struct CsrfKey([u8; 32]);

impl fmt::Debug for CsrfKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("CsrfKey(..)")
    }
}

impl CsrfKey {
    /// A random key, this process's own.
    pub(crate) fn random() -> Self {
        Self(rand::random())
    }

    /// The key of `secret` (shared by a service's replicas).
    pub(crate) fn from_secret(secret: [u8; 32]) -> Self {
        Self(secret)
    }

    /// The MAC of `operator`'s forms of a page served at `issued`.
    /// (HMAC takes keys of any length: `None` never happens.)
    fn mac(&self, operator: &Operator, issued: u64) -> Option<HmacSha256> {
        let mut mac = <HmacSha256 as KeyInit>::new_from_slice(&self.0).ok()?;
        mac.update(b"idem-admin form\0");
        mac.update(operator.as_str().as_bytes());
        mac.update(b"\0");
        mac.update(&issued.to_be_bytes());
        Some(mac)
    }

    /// A token for `operator`'s forms, issued now (empty, and so refused,
    /// if no MAC could be made).
    pub(crate) fn token(&self, operator: &Operator) -> String {
        let issued = unix_seconds();
        self.mac(operator, issued).map_or_else(String::new, |mac| {
            format!("{issued}.{}", hex::encode(mac.finalize().into_bytes()))
        })
    }

    /// Whether `token` was issued to `operator` by this key, within its
    /// lifetime.
    pub(crate) fn verify(&self, operator: &Operator, token: &str) -> bool {
        let Some((issued, tag)) = token.split_once('.') else {
            return false;
        };
        let (Ok(issued), Ok(tag)) = (issued.parse::<u64>(), hex::decode(tag)) else {
            return false;
        };
        let now = unix_seconds();
        let fresh = issued <= now + 60 && now.saturating_sub(issued) <= TOKEN_LIFETIME.as_secs();
        fresh
            && self
                .mac(operator, issued)
                .is_some_and(|mac| mac.verify_slice(&tag).is_ok())
    }
}

fn unix_seconds() -> u64 {
    u64::try_from(SystemClock.now().as_unix_millis() / 1_000).unwrap_or(0)
}

/// Whether a method changes anything (and so must come from the console's
/// own pages or a non-browser client).
pub(crate) fn is_unsafe(method: &Method) -> bool {
    !matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS)
}

/// Why an unsafe request from a browser is refused: it comes from another
/// site, by its `Sec-Fetch-Site` or its `Origin`. A request with neither
/// (a script, `curl`) is let through: only browsers send ambient
/// credentials across sites, and they send these headers.
pub(crate) fn cross_site(headers: &HeaderMap, trusted: &[String]) -> Option<String> {
    if let Some(site) = headers.get("sec-fetch-site")
        && !matches!(site.as_bytes(), b"same-origin" | b"none")
    {
        return Some(format!(
            "a {} request (Sec-Fetch-Site) is refused",
            String::from_utf8_lossy(site.as_bytes())
        ));
    }
    let origin = headers.get(header::ORIGIN)?;
    let origin = origin.to_str().unwrap_or("null");
    if trusted.iter().any(|t| t == origin) {
        return None;
    }
    let host = headers.get(header::HOST).and_then(|h| h.to_str().ok());
    let authority = origin
        .strip_prefix("https://")
        .or_else(|| origin.strip_prefix("http://"));
    match (authority, host) {
        (Some(authority), Some(host)) if authority.eq_ignore_ascii_case(host) => None,
        _ => Some(format!("a request from origin {origin:?} is refused")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.insert(*name, HeaderValue::from_static(value));
        }
        map
    }

    #[test]
    fn a_token_is_the_operators_own_and_this_keys_own() {
        let key = CsrfKey::random();
        let jane = Operator::new("jane").unwrap();
        let token = key.token(&jane);
        assert!(key.verify(&jane, &token));
        assert!(!key.verify(&Operator::new("john").unwrap(), &token));
        assert!(!CsrfKey::random().verify(&jane, &token));
        assert!(!key.verify(&jane, "1.00"));
        assert!(!key.verify(&jane, ""));
    }

    #[test]
    fn an_old_token_is_refused() {
        let key = CsrfKey::from_secret([7; 32]);
        let jane = Operator::new("jane").unwrap();
        let issued = unix_seconds() - TOKEN_LIFETIME.as_secs() - 1;
        let tag = hex::encode(key.mac(&jane, issued).unwrap().finalize().into_bytes());
        assert!(!key.verify(&jane, &format!("{issued}.{tag}")));
        let fresh = issued + 2;
        let tag = hex::encode(key.mac(&jane, fresh).unwrap().finalize().into_bytes());
        assert!(key.verify(&jane, &format!("{fresh}.{tag}")));
    }

    #[test]
    fn requests_from_another_site_are_refused_and_the_consoles_own_pass() {
        let trusted = ["https://ops.example.com".to_string()];
        assert!(cross_site(&headers(&[("sec-fetch-site", "cross-site")]), &[]).is_some());
        assert!(cross_site(&headers(&[("sec-fetch-site", "same-site")]), &[]).is_some());
        assert!(cross_site(&headers(&[("sec-fetch-site", "same-origin")]), &[]).is_none());
        let evil = [("origin", "http://evil.test"), ("host", "127.0.0.1:80")];
        assert!(cross_site(&headers(&evil), &[]).is_some());
        let own = [("origin", "http://127.0.0.1:80"), ("host", "127.0.0.1:80")];
        assert!(cross_site(&headers(&own), &[]).is_none());
        let null = [("origin", "null"), ("host", "127.0.0.1:80")];
        assert!(cross_site(&headers(&null), &[]).is_some());
        let proxied = [("origin", "https://ops.example.com"), ("host", "10.0.0.1")];
        assert!(cross_site(&headers(&proxied), &trusted).is_none());
        assert!(
            cross_site(&headers(&[]), &[]).is_none(),
            "a script sends neither"
        );
    }
}
