//! What a test reads from kube's typed clients when the API server refuses a call: the
//! `Status` (code, reason, message, causes), as kube-apiserver sends it.

/// The `Status` of a failed call: (code, reason, message, causes as (field, message)).
pub fn status(err: kube::Error) -> (u16, String, String, Vec<(String, String)>) {
    match err {
        kube::Error::Api(s) => {
            let causes = s
                .details
                .map(|d| d.causes.into_iter().map(|c| (c.field, c.message)).collect())
                .unwrap_or_default();
            (s.code, s.reason, s.message, causes)
        }
        other => panic!("expected an API error, got {other:?}"),
    }
}

/// (code, reason, message) of a refused call.
pub fn refusal(err: kube::Error) -> (u16, String, String) {
    let (code, reason, message, _) = status(err);
    (code, reason, message)
}

/// (code, reason) of a refused call.
pub fn code_reason(err: kube::Error) -> (u16, String) {
    let (code, reason, _, _) = status(err);
    (code, reason)
}
