'use strict';
// Stand-in for posthog-node (Artillery's telemetry client): same surface, sends nothing.
// ARTILLERY_DISABLE_TELEMETRY alone still posts at the end of a run and retries for ~12 s.
class PostHog {
  constructor() {}
  capture() {}
  identify() {}
  alias() {}
  groupIdentify() {}
  flush() { return Promise.resolve(); }
  shutdown() { return Promise.resolve(); }
  shutdownAsync() { return Promise.resolve(); }
  on() { return this; }
}
module.exports = { PostHog, default: PostHog };
