//! Core ↔ obey wire types. Mappings only: no decision is made here.

use paddock_core as core;
use paddock_proto::obey::local::v1 as pb;

/// A recorded wall-clock time on the wire.
pub fn timestamp(t: core::Timestamp) -> prost_types::Timestamp {
    let ms = t.millis();
    prost_types::Timestamp {
        seconds: (ms / 1000) as i64,
        nanos: ((ms % 1000) * 1_000_000) as i32,
    }
}

pub fn opt_timestamp(t: Option<core::Timestamp>) -> Option<prost_types::Timestamp> {
    t.map(timestamp)
}

/// A timestamp in ms since the epoch, or why it is not one paddock can keep: before the
/// epoch, `nanos` outside `0..1e9` (the well-known type's own rule), or past what ms in a u64
/// can hold. Nothing is clamped or wrapped silently.
pub fn timestamp_ms(ts: &prost_types::Timestamp) -> Result<u64, BadTime> {
    checked_ms(ts.seconds, ts.nanos).ok_or(BadTime::Timestamp {
        seconds: ts.seconds,
        nanos: ts.nanos,
    })
}

/// A duration in ms, or why it is not one: negative, `nanos` outside `0..1e9`, or too long.
pub fn duration_ms(d: &prost_types::Duration) -> Result<u64, BadTime> {
    checked_ms(d.seconds, d.nanos).ok_or(BadTime::Duration {
        seconds: d.seconds,
        nanos: d.nanos,
    })
}

/// A request's time that paddock cannot keep ([`timestamp_ms`], [`duration_ms`]).
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum BadTime {
    #[error(
        "timestamp {{seconds: {seconds}, nanos: {nanos}}} is not a valid time after the epoch"
    )]
    Timestamp { seconds: i64, nanos: i32 },
    #[error(
        "duration {{seconds: {seconds}, nanos: {nanos}}} must be non-negative, with nanos below \
         1e9, and fit in 2^64 ms"
    )]
    Duration { seconds: i64, nanos: i32 },
}

fn checked_ms(seconds: i64, nanos: i32) -> Option<u64> {
    if seconds < 0 || !(0..1_000_000_000).contains(&nanos) {
        return None;
    }
    (seconds as u64)
        .checked_mul(1000)?
        .checked_add(nanos as u64 / 1_000_000)
}

pub fn duration(ms: u64) -> prost_types::Duration {
    prost_types::Duration {
        seconds: (ms / 1000) as i64,
        nanos: ((ms % 1000) * 1_000_000) as i32,
    }
}

/// A session as the obey API shows it. `unrecognized_lines` is the shell's count, not the
/// core's: see [`session_info_with`].
pub fn session_info(r: &core::SessionRecord) -> pb::SessionInfo {
    session_info_with(r, 0)
}

/// [`session_info`] with the count of the session's unrecognized provider lines.
pub fn session_info_with(r: &core::SessionRecord, unrecognized_lines: u64) -> pb::SessionInfo {
    session_info_full(r, unrecognized_lines, 0)
}

/// [`session_info_with`] and the number of requests waiting for a human.
pub fn session_info_full(
    r: &core::SessionRecord,
    unrecognized_lines: u64,
    pending_approvals: usize,
) -> pb::SessionInfo {
    session_info_as(r, unrecognized_lines, pending_approvals, View::Full)
}

/// How much of a session a reply carries (obey's `SessionView`, a paddock extension).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum View {
    /// Every field.
    Full,
    /// What a list shows: no `provider_config` or `timeout`, the environment's driver,
    /// worktree and network only (none for the host's), the initial message's first
    /// [`BASIC_MESSAGE_BYTES`].
    Basic,
}

impl View {
    /// The view a request names (`SESSION_VIEW_UNSPECIFIED`: full), or `None` for a number
    /// that is none.
    pub fn from_number(n: i32) -> Option<View> {
        match pb::SessionView::try_from(n).ok()? {
            pb::SessionView::Unspecified | pb::SessionView::Full => Some(View::Full),
            pb::SessionView::Basic => Some(View::Basic),
        }
    }
}

/// How much of a session's initial message its basic view carries.
pub const BASIC_MESSAGE_BYTES: usize = 256;

/// A session as `view` shows it.
pub fn session_info_as(
    r: &core::SessionRecord,
    unrecognized_lines: u64,
    pending_approvals: usize,
    view: View,
) -> pb::SessionInfo {
    let c = &r.config;
    let full = view == View::Full;
    pb::SessionInfo {
        pending_approvals: pending_approvals as i32,
        unrecognized_lines: unrecognized_lines as i64,
        id: r.id.0.clone(),
        campaign_id: c.campaign_id.clone(),
        provider: c.provider.number(),
        model: c.model.clone(),
        agent_name: c.agent_name.clone(),
        status: r.status.number(),
        festival_id: c.festival_id.clone(),
        task_id: c.task_id.clone(),
        tokens_input: r.tokens_input as i64,
        tokens_output: r.tokens_output as i64,
        max_tokens: c.max_tokens as i64,
        pid: r.pid.map(|p| p as i32).unwrap_or(0),
        restart_count: r.restart_count as i32,
        created_at: Some(timestamp(r.created_at)),
        started_at: opt_timestamp(r.started_at),
        last_activity_at: opt_timestamp(r.last_activity_at),
        ended_at: opt_timestamp(r.ended_at),
        error_message: r.error.as_ref().map(|e| e.to_string()).unwrap_or_default(),
        working_dir: c.working_dir.clone(),
        error_code: r
            .error
            .as_ref()
            .map(|e| e.code.to_string())
            .unwrap_or_default(),
        // Credentials never leave the daemon: their keys show, their values read as the mask.
        provider_config: match full {
            true => crate::secret::redact(&c.provider_config).collect(),
            false => Default::default(),
        },
        timeout: (full && c.timeout_ms > 0).then(|| duration(c.timeout_ms)),
        initial_message: match full {
            true => c.initial_message.clone(),
            false => crate::text::truncate(&c.initial_message, BASIC_MESSAGE_BYTES).into_owned(),
        },
        turns_completed: r.turns.saturating_sub(u64::from(r.turn_open)) as i64,
        last_turn_failed: r.last_turn_failed,
        environment_spec: match full {
            true => Some(Box::new(environment_spec(&c.env))),
            // Unset is the host's ("local", no worktree), as at a create.
            false if c.env.driver == core::Driver::Local && !c.env.worktree && !c.env.network => {
                None
            }
            false => Some(Box::new(pb::SessionEnvironment {
                driver: c.env.driver.name().to_string(),
                worktree: c.env.worktree,
                network: c.env.network,
                ..Default::default()
            })),
        },
        environment_state: r.env_state.name().to_string(),
        disconnected: r.disconnected,
    }
}

pub fn environment_spec(e: &core::EnvSpec) -> pb::SessionEnvironment {
    pb::SessionEnvironment {
        driver: e.driver.name().to_string(),
        worktree: e.worktree,
        network: e.network,
        image: e.image.clone(),
        memory_bytes: e.memory_bytes,
        pids_limit: e.pids,
        mounts: e.podman.mounts.clone(),
        ports: e.podman.ports.clone(),
        flags: e.podman.flags.clone(),
        env: e.podman.env.clone().into_iter().collect(),
        qemu: (!e.qemu().is_empty()).then(|| pb::QemuOptions {
            cpus: e.qemu().cpus,
            flags: e.qemu().flags.clone(),
        }),
        ssh: (!e.ssh().is_empty()).then(|| {
            let t = e.ssh();
            pb::SshTarget {
                host: t.host.clone(),
                port: u32::from(t.port),
                user: t.user.clone(),
                key_file: t.key_file.clone(),
                known_hosts: t.known_hosts.clone(),
                accept_new_host_key: t.accept_new_host_key,
                paddock: t.paddock.clone(),
                remote_dir: t.remote_dir.clone(),
                workdir: t.workdir.clone(),
            }
        }),
        kubernetes: (!e.kubernetes().is_empty()).then(|| {
            let k = e.kubernetes();
            pb::KubernetesOptions {
                namespace: k.namespace.clone(),
                service_account: k.service_account.clone(),
                pod_spec_json: k.pod_spec.clone(),
                kubeconfig: k.kubeconfig.clone(),
                context: k.context.clone(),
            }
        }),
    }
}

/// A request's environment: the environments crate's reading of it.
pub use crate::env::request::env_spec;

/// The wire form of an activity, its text moved, not copied (a turn's stream and a page own
/// what they send; a watcher of many clones its copy first).
pub fn activity_event(e: core::ActivityEvent) -> pb::SessionActivityEvent {
    let a = e.activity;
    pb::SessionActivityEvent {
        session_id: e.session.0,
        r#type: a.kind().number(),
        content: a.content,
        tool_name: a.tool_name,
        tool_call_id: a.tool_call_id,
        tool_success: a.tool_success,
        tokens_input: a.tokens_input as i64,
        tokens_output: a.tokens_output as i64,
        timestamp: Some(timestamp(e.at)),
        seq: e.seq as i64,
    }
}

pub fn history_item(i: &crate::api::history::Item) -> pb::HistoryItem {
    pb::HistoryItem {
        turn: i.turn as i64,
        role: i.role.name().to_string(),
        content: i.content.clone(),
        tool_name: i.tool_name.clone(),
        tool_call_id: i.tool_call_id.clone(),
        tool_success: i.tool_success,
        timestamp: Some(timestamp(i.at)),
    }
}

pub fn status_event(e: &core::StatusEvent) -> pb::SessionStatusEvent {
    pb::SessionStatusEvent {
        session_id: e.session.0.clone(),
        previous_status: e.previous.map(|s| s.number()).unwrap_or(0),
        new_status: e.new.number(),
        message: e.message.clone(),
        timestamp: Some(timestamp(e.at)),
        seq: e.seq as i64,
    }
}

pub fn session_summary(r: &core::SessionRecord) -> pb::SessionSummary {
    pb::SessionSummary {
        id: r.id.0.clone(),
        campaign_id: r.config.campaign_id.clone(),
        provider: r.config.provider.number(),
        agent_name: r.config.agent_name.clone(),
        status: r.status.number(),
    }
}

/// A core error as a gRPC status, for every protocol ([`crate::transport::core_status`]).
pub use crate::transport::core_status as status;

/// How much of a request's tool input a message carries (a 4 MiB file write would not fit a
/// gRPC message next to anything else).
pub const APPROVAL_INPUT_MAX_BYTES: usize = 64 * 1024;

/// A request for a human as the obey API shows it.
pub fn approval(a: &core::Approval) -> pb::Approval {
    let input = crate::text::prefix(&a.input, APPROVAL_INPUT_MAX_BYTES);
    pb::Approval {
        input_truncated: input.len() < a.input.len(),
        id: a.id.clone(),
        session_id: a.session.0.clone(),
        kind: a.kind.number(),
        tool_name: a.tool.clone(),
        input_json: input.to_string(),
        summary: a.summary.clone(),
        state: a.state.number(),
        created_at: Some(timestamp(a.created_at)),
        expires_at: Some(timestamp(a.expires_at)),
        resolved_at: opt_timestamp(a.resolved_at),
        answer: a.answer.clone(),
        allowed: a.allowed,
        resolved_by: a.resolved_by.clone(),
        turn: a.turn.unwrap_or(0) as i64,
    }
}

/// A ResolveApproval request as the core's decision; an unspecified one is `InvalidArgument`.
pub fn decision(
    d: pb::ApprovalDecision,
    text: String,
    is_error: bool,
) -> Result<core::Decision, tonic::Status> {
    match d {
        pb::ApprovalDecision::Approve => Ok(core::Decision::Approve),
        pb::ApprovalDecision::Deny => Ok(core::Decision::Deny { reason: text }),
        pb::ApprovalDecision::Answer => Ok(core::Decision::Answer { text, is_error }),
        pb::ApprovalDecision::Unspecified => Err(tonic::Status::invalid_argument(
            "decision is required: APPROVE, DENY or ANSWER",
        )),
    }
}

/// The most bytes of items one list reply carries, well under the largest message
/// ([`crate::transport::MESSAGE_MAX_BYTES`]) so that the envelope always fits: lists page by
/// size, not only by count, and one large item never makes a list fail for good.
pub const REPLY_ITEMS_BYTES_MAX: usize = 3 * 1024 * 1024;

/// The leading items of `items` that fit in [`REPLY_ITEMS_BYTES_MAX`] (always at least one,
/// cut to fit when it alone is larger), and whether any were left out.
pub fn page_by_size<M: prost::Message + Fitted>(
    items: impl IntoIterator<Item = M>,
) -> (Vec<M>, bool) {
    let mut out = Vec::new();
    let mut bytes = 0;
    for mut item in items {
        let len = item.encoded_len() + 8; // the field's tag and length
        if !out.is_empty() && bytes + len > REPLY_ITEMS_BYTES_MAX {
            return (out, true);
        }
        if len > REPLY_ITEMS_BYTES_MAX {
            item.fit(REPLY_ITEMS_BYTES_MAX / 2);
        }
        bytes += len;
        out.push(item);
    }
    (out, false)
}

/// An item whose largest text can be cut so that it fits in one reply.
pub trait Fitted {
    fn fit(&mut self, max_bytes: usize);
}

fn cut(s: &mut String, max_bytes: usize) {
    if s.len() > max_bytes {
        *s = crate::text::truncate(s, max_bytes).into_owned();
    }
}

impl Fitted for pb::SessionActivityEvent {
    fn fit(&mut self, max_bytes: usize) {
        cut(&mut self.content, max_bytes);
    }
}

impl Fitted for pb::HistoryItem {
    fn fit(&mut self, max_bytes: usize) {
        cut(&mut self.content, max_bytes);
    }
}

impl Fitted for pb::SessionInfo {
    fn fit(&mut self, max_bytes: usize) {
        let each = max_bytes / 4;
        cut(&mut self.initial_message, each);
        cut(&mut self.agent_name, each);
        cut(&mut self.error_message, each);
        cut(&mut self.working_dir, each);
    }
}

/// A request's `limit` as a page size: its own when positive (at most `max`), else `default`.
pub fn page_limit(asked: i32, default: usize, max: usize) -> usize {
    match asked {
        n if n <= 0 => default,
        n => (n as usize).min(max),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_carry_the_code_in_text_and_error_info() {
        let s = status(&core::Error::new(
            core::ErrorCode::CampaignNotFound,
            "campaign \"x\" not found",
        ));
        assert_eq!(s.code(), tonic::Code::NotFound);
        assert_eq!(s.message(), "OBEY-2001: campaign \"x\" not found");
        assert_eq!(
            crate::transport::obey_code(&s),
            Some(core::ErrorCode::CampaignNotFound)
        );
    }

    #[test]
    fn timestamps_round_trip() {
        let ms = 1_771_425_000_123;
        assert_eq!(
            timestamp_ms(&timestamp(core::Timestamp::from_millis(ms))).unwrap(),
            ms
        );
        assert_eq!(duration_ms(&duration(1500)), Ok(1500));
        let d = |seconds, nanos| prost_types::Duration { seconds, nanos };
        assert!(
            duration_ms(&d(18_446_744_073_709_552, 0)).is_err(),
            "overflow"
        );
        assert!(duration_ms(&d(1, 2_000_000_000)).is_err(), "nanos past 1e9");
        assert_eq!(
            duration_ms(&d(-1, 0)),
            Err(BadTime::Duration {
                seconds: -1,
                nanos: 0
            })
        );
        assert!(duration_ms(&d(1, -1)).is_err());
        let before_epoch = prost_types::Timestamp {
            seconds: -5,
            nanos: 0,
        };
        assert_eq!(
            timestamp_ms(&before_epoch).unwrap_err().to_string(),
            "timestamp {seconds: -5, nanos: 0} is not a valid time after the epoch"
        );
        assert_eq!(
            duration_ms(&d(i64::MAX / 1000, 999_999_999)).ok(),
            Some((i64::MAX / 1000) as u64 * 1000 + 999)
        );
    }
}
