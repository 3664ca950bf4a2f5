//! What every route of a console's router shares: the console, and the
//! checks that guard it.

use std::sync::Arc;

use crate::admin::Admin;
use crate::security::{Authorize, CsrfKey};

/// The router's state.
#[derive(Clone)]
pub(crate) struct Shared {
    pub(crate) admin: Arc<Admin>,
    pub(crate) guard: Arc<Guard>,
}

/// The service's authorization check, the forms' token key, and the
/// origins trusted beside the request's own host.
pub(crate) struct Guard {
    pub(crate) authorize: Box<dyn Authorize>,
    pub(crate) csrf: CsrfKey,
    pub(crate) trusted_origins: Vec<String>,
}
