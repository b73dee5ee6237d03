'use strict';
// Artillery processor for app-integration.yml: one JSON line per response (when the request
// was sent, its status, its latency) into the file named by APP_INTEGRATION_LOG, so the
// experiment can count accepted/rejected requests per second and split latency by outcome
// (Artillery's own report only has aggregates per 10 s period, in whole milliseconds).
const fs = require('fs');

const LOG = process.env.APP_INTEGRATION_LOG;

// beforeRequest: note the time on a monotonic clock with sub-millisecond resolution.
function startTimer(req, context, events, next) {
  context.vars.$sentNs = process.hrtime.bigint();
  context.vars.$sentMs = Date.now();
  return next();
}

// afterResponse: latency_ms from startTimer to the whole response (connecting included: each
// virtual user opens its own connection); first_byte_ms is Artillery's http.response_time.
function recordResponse(req, res, context, events, next) {
  if (LOG && context.vars.$sentNs !== undefined) {
    const elapsedNs = process.hrtime.bigint() - context.vars.$sentNs;
    const line = {
      sent_ms: context.vars.$sentMs, // epoch milliseconds
      status: res.statusCode,
      latency_ms: Number(elapsedNs) / 1e6,
      first_byte_ms: res.timings && res.timings.phases ? res.timings.phases.firstByte : null,
      app_ms: appMs(res.headers['server-timing'])
    };
    // One write per line with O_APPEND: lines of concurrent workers never interleave.
    fs.appendFileSync(LOG, JSON.stringify(line) + '\n');
  }
  return next();
}

// The demo app's own time, from its `Server-Timing: app;dur=<ms>` header (null without one).
function appMs(header) {
  const match = /(?:^|,)\s*app;dur=([0-9.]+)/.exec(header || '');
  return match ? Number(match[1]) : null;
}

module.exports = { startTimer, recordResponse };
