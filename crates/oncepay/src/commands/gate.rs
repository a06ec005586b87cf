//! The gate money commands pass: closed while the providers' books are
//! reconciled after the database was restored or failed over with a gap in
//! its history (`books::restore_guard` opens and closes it).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Whether money commands may run: closed while a gap in the database's
/// history is being reconciled (`restore_guard`).
#[derive(Debug, Clone, Default)]
pub struct Gate(Arc<AtomicBool>);

impl Gate {
    /// Whether money commands wait.
    pub fn is_closed(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }

    /// Closes or opens it (the restore guard, `books::observe`).
    pub(crate) fn set_closed(&self, closed: bool) {
        self.0.store(closed, Ordering::Release);
    }
}

/// `503 restore_reconciliation`: money commands wait while the books
/// reconcile a gap in the database's history; reads keep working.
pub(crate) fn gate_closed() -> crate::problem::Problem {
    crate::problem::Problem::new(
        crate::problem::ProblemCode::RestoreReconciliation,
        "the database was restored (or failed over) and the provider's books are being reconciled before money moves again; retry shortly",
    )
    .retry_after(2)
}
