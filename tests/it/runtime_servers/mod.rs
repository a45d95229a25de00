//! The function servers in `runtimes/_servers/` (Node.js, and Python on bottle and cheroot)
//! implement Kyma's runtime contract, so existing Kyma Functions run unchanged.
//!
//! Each test starts the host's `node` or `python3` directly on `runtimes/_servers/*/server.*`
//! with a fixture Function from `tests/fixtures/servers/` (its `main` dispatches on the request
//! path), on port 0 (the server logs the port it got), and talks HTTP to it on 127.0.0.1. No
//! image is involved: the base images' Kyma runtime packages (the OpenTelemetry SDK, axios;
//! bottle, cheroot, requests…) are installed from the same locks into shared directories for
//! `NODE_PATH` and `PYTHONPATH`. `KILN_TEST_NODE` / `KILN_TEST_PYTHON` pick other interpreters.
//!
//! The server harness is `common::function_server`; the checks live in one module per topic
//! and run here once per runtime, each test named as a sentence.

mod events;
mod frameworks;
mod http;
mod lifecycle;
mod new_api;
mod tracing;

use crate::common::function_server::Runtime;
use events::{
    a_reply_event_is_built_and_published_the_deprecated_way,
    a_request_is_a_cloud_event_only_when_it_is_one_and_gets_an_id_and_a_time,
    binary_cloud_event_fills_ce_fields,
    emitted_cloud_events_are_valid_with_a_time_and_return_the_publishers_answer,
    structured_cloud_event_fills_ce_fields,
};
use http::{
    a_body_over_the_limit_gets_413, a_client_that_writes_the_whole_body_first_reads_the_413,
    a_throw_answers_500_and_logs_the_stack, an_endless_upload_over_the_limit_is_cut_off,
    built_in_endpoints_and_preflight_skip_the_function,
    http_1_0_keep_alive_clients_reuse_the_connection, json_body_round_trips_with_context,
    metrics_count_calls_and_failures, status_and_headers_set_by_the_function_reach_the_client,
    text_form_raw_and_empty_bodies_are_parsed,
};
use lifecycle::{
    a_slow_function_times_out_with_408, calls_in_flight_together_time_out_each_on_its_own,
    sigterm_drains_in_flight_requests_then_exits_zero,
    sigterm_exits_promptly_while_a_timed_out_call_still_runs,
};
use tracing::{
    a_request_without_a_trace_starts_one_that_outgoing_calls_carry,
    incoming_traces_continue_into_outgoing_calls_and_the_functions_spans,
    spans_are_exported_to_the_trace_collector_over_otlp_http,
};

/// One test per runtime and check, each named as a sentence.
macro_rules! for_both_runtimes {
    ($($check:ident: $node:ident, $python:ident;)*) => {$(
        #[tokio::test]
        async fn $node() {
            $check(Runtime::Node).await;
        }

        #[tokio::test]
        async fn $python() {
            $check(Runtime::Python).await;
        }
    )*};
}

for_both_runtimes! {
    json_body_round_trips_with_context:
        node_echoes_a_json_body_as_json_with_the_function_context,
        python_echoes_a_json_body_as_json_with_the_function_context;
    binary_cloud_event_fills_ce_fields:
        node_fills_the_ce_fields_from_binary_mode_cloud_event_headers,
        python_fills_the_ce_fields_from_binary_mode_cloud_event_headers;
    structured_cloud_event_fills_ce_fields:
        node_fills_the_ce_fields_and_data_from_a_structured_mode_cloud_event,
        python_fills_the_ce_fields_and_data_from_a_structured_mode_cloud_event;
    text_form_raw_and_empty_bodies_are_parsed:
        node_passes_text_form_raw_and_missing_bodies_as_string_object_bytes_and_nothing,
        python_passes_text_form_raw_and_missing_bodies_as_string_object_bytes_and_nothing;
    status_and_headers_set_by_the_function_reach_the_client:
        node_sends_the_status_and_headers_the_function_set,
        python_sends_the_status_and_headers_the_function_set;
    built_in_endpoints_and_preflight_skip_the_function:
        node_answers_healthz_favicon_and_cors_preflight_without_calling_the_function,
        python_answers_healthz_favicon_and_cors_preflight_without_calling_the_function;
    metrics_count_calls_and_failures:
        node_metrics_count_calls_and_failures_and_expose_a_duration_histogram,
        python_metrics_count_calls_and_failures_and_expose_a_duration_histogram;
    a_throw_answers_500_and_logs_the_stack:
        node_answers_500_when_the_function_throws_and_logs_the_stack,
        python_answers_500_when_the_function_raises_and_logs_the_traceback;
    calls_in_flight_together_time_out_each_on_its_own:
        node_times_out_calls_in_flight_together_each_on_its_own,
        python_times_out_calls_in_flight_together_each_on_its_own;
    a_slow_function_times_out_with_408:
        node_answers_408_when_the_function_runs_past_func_timeout,
        python_answers_408_when_the_function_runs_past_func_timeout;
    a_client_that_writes_the_whole_body_first_reads_the_413:
        node_reads_the_rest_of_an_upload_over_the_limit_so_the_client_reads_its_413,
        python_reads_the_rest_of_an_upload_over_the_limit_so_the_client_reads_its_413;
    a_body_over_the_limit_gets_413:
        node_answers_413_to_a_body_over_req_mb_limit_without_calling_the_function,
        python_answers_413_to_a_body_over_req_mb_limit_without_calling_the_function;
    sigterm_drains_in_flight_requests_then_exits_zero:
        node_finishes_in_flight_requests_on_sigterm_then_exits_zero,
        python_finishes_in_flight_requests_on_sigterm_then_exits_zero;
    sigterm_exits_promptly_while_a_timed_out_call_still_runs:
        node_exits_promptly_on_sigterm_while_a_timed_out_call_still_runs,
        python_exits_promptly_on_sigterm_while_a_timed_out_call_still_runs;
    emitted_cloud_events_are_valid_with_a_time_and_return_the_publishers_answer:
        node_emits_valid_cloud_events_with_a_time_and_resolves_to_the_publishers_answer,
        python_emits_valid_cloud_events_with_a_time_and_returns_the_publishers_answer;
    a_reply_event_is_built_and_published_the_deprecated_way:
        node_builds_and_publishes_a_reply_event_the_deprecated_way,
        python_builds_and_publishes_a_reply_event_the_deprecated_way;
    a_request_is_a_cloud_event_only_when_it_is_one_and_gets_an_id_and_a_time:
        node_sets_ce_fields_only_for_cloud_events_and_fills_id_and_time,
        python_sets_ce_keys_only_for_cloud_events_and_fills_id_and_time;
    incoming_traces_continue_into_outgoing_calls_and_the_functions_spans:
        node_continues_w3c_and_b3_traces_into_outgoing_calls_and_the_functions_spans,
        python_continues_w3c_and_b3_traces_into_outgoing_calls_and_the_functions_spans;
    a_request_without_a_trace_starts_one_that_outgoing_calls_carry:
        node_starts_a_trace_for_a_request_without_one_and_outgoing_calls_carry_it,
        python_starts_a_trace_for_a_request_without_one_and_outgoing_calls_carry_it;
    http_1_0_keep_alive_clients_reuse_the_connection:
        node_sizes_every_answer_so_http_1_0_keep_alive_clients_reuse_the_connection,
        python_sizes_every_answer_so_http_1_0_keep_alive_clients_reuse_the_connection;
    spans_are_exported_to_the_trace_collector_over_otlp_http:
        node_exports_spans_to_the_trace_collector_over_otlp_http,
        python_exports_spans_to_the_trace_collector_over_otlp_http;
}

#[tokio::test]
async fn python_runs_a_library_the_function_instruments_in_the_requests_trace() {
    tracing::a_library_the_function_instruments_continues_the_requests_trace(Runtime::Python).await;
}

#[tokio::test]
async fn python314_runs_a_library_the_function_instruments_in_the_requests_trace() {
    tracing::a_library_the_function_instruments_continues_the_requests_trace(Runtime::Flask).await;
}

/// The checks the new-API runtimes (nodejs26, python314) share with the legacy ones: tracing,
/// the built-in endpoints, SIGTERM's drain.
macro_rules! for_new_api_runtimes {
    ($($check:ident: $express:ident, $flask:ident;)*) => {$(
        #[tokio::test]
        async fn $express() {
            $check(Runtime::Express).await;
        }

        #[tokio::test]
        async fn $flask() {
            $check(Runtime::Flask).await;
        }
    )*};
}

for_new_api_runtimes! {
    incoming_traces_continue_into_outgoing_calls_and_the_functions_spans:
        nodejs26_continues_w3c_and_b3_traces_into_outgoing_calls_and_the_sdk_tracers_spans,
        python314_continues_w3c_and_b3_traces_into_outgoing_calls_and_the_sdk_tracers_spans;
    a_request_without_a_trace_starts_one_that_outgoing_calls_carry:
        nodejs26_starts_a_trace_for_a_request_without_one_and_outgoing_calls_carry_it,
        python314_starts_a_trace_for_a_request_without_one_and_outgoing_calls_carry_it;
    spans_are_exported_to_the_trace_collector_over_otlp_http:
        nodejs26_exports_spans_to_the_trace_collector_over_otlp_http,
        python314_exports_spans_to_the_trace_collector_over_otlp_http;
    built_in_endpoints_and_preflight_skip_the_function:
        nodejs26_answers_healthz_favicon_and_cors_preflight_without_calling_the_function,
        python314_answers_healthz_favicon_and_cors_preflight_without_calling_the_function;
    sigterm_drains_in_flight_requests_then_exits_zero:
        nodejs26_finishes_in_flight_requests_on_sigterm_then_exits_zero,
        python314_finishes_in_flight_requests_on_sigterm_then_exits_zero;
}

#[tokio::test]
async fn nodejs26_reads_the_rest_of_an_upload_over_the_limit_so_the_client_reads_its_413() {
    a_client_that_writes_the_whole_body_first_reads_the_413(Runtime::Express).await;
}

#[tokio::test]
async fn python314_reads_the_rest_of_an_upload_over_the_limit_so_the_client_reads_its_413() {
    a_client_that_writes_the_whole_body_first_reads_the_413(Runtime::Flask).await;
}

#[tokio::test]
async fn node_cuts_off_an_endless_upload_over_the_limit() {
    an_endless_upload_over_the_limit_is_cut_off(Runtime::Node).await;
}

#[tokio::test]
async fn python_cuts_off_an_endless_upload_over_the_limit() {
    an_endless_upload_over_the_limit_is_cut_off(Runtime::Python).await;
}

#[tokio::test]
async fn nodejs26_cuts_off_an_endless_upload_over_the_limit() {
    an_endless_upload_over_the_limit_is_cut_off(Runtime::Express).await;
}

#[tokio::test]
async fn python314_cuts_off_an_endless_upload_over_the_limit() {
    an_endless_upload_over_the_limit_is_cut_off(Runtime::Flask).await;
}

/// A result the server cannot send (a circular object) and a status no answer can carry both
/// answer 500, as Kyma's Express did; they left the client waiting for good.
#[tokio::test]
async fn node_answers_500_for_a_result_or_a_status_it_cannot_send() {
    http::unsendable_results_answer_500().await;
}

/// What a Python Function reads through bottle works past 100 KiB (Kyma raised bottle's limit),
/// its own CORS origin stands, and a malformed chunked body closes the connection.
#[tokio::test]
async fn python_parses_large_bodies_keeps_the_functions_cors_and_closes_after_a_bad_chunk() {
    http::python_bottle_limits_cors_and_a_bad_chunk().await;
}

/// A timed-out call that returns while every thread is busy leaves a shutdown request queued
/// for one idle thread; the next timeouts' replacement threads may take it at once. The 408s
/// still come, the server still answers, and SIGTERM still ends it.
#[tokio::test]
async fn python_keeps_answering_408_when_a_late_return_meets_a_busy_pool() {
    lifecycle::a_late_return_into_a_busy_pool_wedges_nothing().await;
}
