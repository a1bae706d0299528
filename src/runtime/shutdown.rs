//! Process shutdown on SIGTERM (Kubernetes) or SIGINT (a terminal).

/// Resolves on the first SIGTERM or SIGINT.
pub async fn signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(s) => s,
            Err(_) => return ctrl_c.await.unwrap_or(()),
        };
        tokio::select! {
            _ = ctrl_c => {},
            _ = term.recv() => {},
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}

/// A token cancelled on the first SIGTERM or SIGINT: the one stop signal a process hands to its
/// servers and loops. `what` names the process in the log line. Call it inside the runtime.
pub fn token(what: &'static str) -> tokio_util::sync::CancellationToken {
    let token = tokio_util::sync::CancellationToken::new();
    let cancel = token.clone();
    tokio::spawn(async move {
        signal().await;
        tracing::info!("shutdown signal received; {what} stops");
        cancel.cancel();
    });
    token
}
