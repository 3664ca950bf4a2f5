//! Whose key it is: the tenant comes from the request, so one tenant's key
//! never replays another's response.

use std::fmt;
use std::sync::Arc;

use http::StatusCode;
use http::header::HeaderName;
use http::request::Parts;
use idem_core::{InvalidInput, Tenant};

/// Why no tenant could be found for a request: answered with `status`.
///
/// ```
/// use http::StatusCode;
/// use idem_http::TenantRejection;
///
/// let rejection = TenantRejection::new(StatusCode::FORBIDDEN, "no account for this key");
/// assert_eq!(rejection.status, StatusCode::FORBIDDEN);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct TenantRejection {
    /// The status of the refusal (400 for a missing header, 401 for a
    /// missing principal, ...).
    pub status: StatusCode,
    /// What is missing, for the problem's detail.
    pub detail: String,
}

type Extract = dyn Fn(&Parts) -> Result<Tenant, TenantRejection> + Send + Sync;

/// Where a request's tenant comes from.
///
/// ```
/// use idem_http::TenantSource;
///
/// /// An authenticated principal, put in the request's extensions by an
/// /// authentication layer that runs before this one.
/// #[derive(Clone)]
/// struct Principal { account: String }
///
/// let from_principal = TenantSource::extension(|p: &Principal| p.account.clone());
/// let from_header = TenantSource::header("X-Tenant-Id")?;
/// let single = TenantSource::fixed("shop");
/// # let _ = (from_principal, from_header, single);
/// # Ok::<(), idem_core::InvalidInput>(())
/// ```
#[derive(Clone)]
pub struct TenantSource(Arc<Extract>);

impl fmt::Debug for TenantSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("TenantSource(..)")
    }
}

impl TenantRejection {
    /// A refusal with `status` and `detail`, for [`TenantSource::with`].
    pub fn new(status: StatusCode, detail: impl Into<String>) -> Self {
        Self {
            status,
            detail: detail.into(),
        }
    }
}

fn rejection(status: StatusCode, detail: impl Into<String>) -> TenantRejection {
    TenantRejection::new(status, detail)
}

impl TenantSource {
    /// One tenant for every request: a single-tenant service.
    ///
    /// An invalid name (empty, over 255 bytes) refuses every request.
    pub fn fixed(name: &str) -> Self {
        let tenant = Tenant::new(name).map_err(|e| {
            rejection(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("the configured tenant is invalid: {e}"),
            )
        });
        Self(Arc::new(move |_| tenant.clone()))
    }

    /// The value of a request header, named in any case; a request without
    /// it is refused with 400.
    ///
    /// # Errors
    ///
    /// [`InvalidInput::Malformed`] if `name` is not a valid header name.
    pub fn header(name: &str) -> Result<Self, InvalidInput> {
        let name =
            HeaderName::from_bytes(name.as_bytes()).map_err(|e| InvalidInput::Malformed {
                field: "tenant header",
                reason: format!("{name:?} is not a header name: {e}"),
            })?;
        Ok(Self(Arc::new(move |parts: &Parts| {
            let value = parts.headers.get(&name).ok_or_else(|| {
                rejection(
                    StatusCode::BAD_REQUEST,
                    format!("the {name} header is missing"),
                )
            })?;
            let text = value.to_str().map_err(|_| {
                rejection(
                    StatusCode::BAD_REQUEST,
                    format!("the {name} header is not text"),
                )
            })?;
            Tenant::new(text)
                .map_err(|e| rejection(StatusCode::BAD_REQUEST, format!("the {name} header: {e}")))
        })))
    }

    /// A value in the request's extensions (an authenticated principal that
    /// an earlier layer put there); a request without one is refused with 401.
    pub fn extension<T, F>(name_of: F) -> Self
    where
        T: Clone + Send + Sync + 'static,
        F: Fn(&T) -> String + Send + Sync + 'static,
    {
        Self(Arc::new(move |parts: &Parts| {
            let principal = parts
                .extensions
                .get::<T>()
                .ok_or_else(|| rejection(StatusCode::UNAUTHORIZED, "no authenticated principal"))?;
            Tenant::new(name_of(principal)).map_err(|e| {
                rejection(
                    StatusCode::UNAUTHORIZED,
                    format!("the principal's tenant: {e}"),
                )
            })
        }))
    }

    /// Any function of the request's head.
    pub fn with<F>(extract: F) -> Self
    where
        F: Fn(&Parts) -> Result<Tenant, TenantRejection> + Send + Sync + 'static,
    {
        Self(Arc::new(extract))
    }

    pub(crate) fn tenant(&self, parts: &Parts) -> Result<Tenant, TenantRejection> {
        (self.0)(parts)
    }
}

impl Default for TenantSource {
    /// One tenant, `default`, for single-tenant services.
    fn default() -> Self {
        Self::fixed("default")
    }
}

#[cfg(test)]
mod tests {
    use http::Request;

    use super::*;

    fn parts(header: (&str, &str)) -> Parts {
        Request::builder()
            .header(header.0, header.1)
            .body(())
            .unwrap()
            .into_parts()
            .0
    }

    #[test]
    fn a_tenant_header_is_named_in_any_case_and_an_invalid_name_is_an_error() {
        let source = TenantSource::header("X-Tenant").unwrap();
        let tenant = source.tenant(&parts(("x-tenant", "acme"))).unwrap();
        assert_eq!(tenant.as_str(), "acme");
        for bad in ["", "x tenant", "x-tenant\n", "é"] {
            assert!(
                matches!(
                    TenantSource::header(bad),
                    Err(InvalidInput::Malformed { .. })
                ),
                "{bad:?}"
            );
        }
    }
}
