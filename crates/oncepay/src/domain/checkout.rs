//! What a checkout session keeps of its shop: where the customer goes
//! back to.

/// Where the page sends the customer back, and in which language it
/// speaks (`POST /orders/{id}/checkout`'s optional body).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WayBack {
    /// After paying; `{CHECKOUT_SESSION_ID}` in it becomes the session's id.
    pub success_url: Option<String>,
    /// When the customer gives up.
    pub cancel_url: Option<String>,
    /// `en`, `ru` or `zh`; `None`: the browser's `Accept-Language`.
    pub locale: Option<&'static str>,
}
