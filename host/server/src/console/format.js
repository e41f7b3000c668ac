// Human units, written exactly as the command line writes them (the rule
// is `format_amount` in host/engine/src/budget.rs and `utc_text` in
// host/syntax/src/units.rs; tests/tests/all/console.rs runs both on the
// same values and compares): money with every digit it has and at least
// cents, never rounded (an amount rounded to cents is one an operator
// cannot act on); durations as `850ms`, `4.5s`, `14m 10s`; counts with
// thousands separators; times as `2025-01-31T12:00:00Z`.

// Nano-units of `currency` (USD, EUR, GBP as signs, any other code after
// the number, none: the bare number).
export function cost(nanos, currency) {
  const n = BigInt(Math.max(0, Math.round(Number(nanos) || 0)));
  const billion = 1000000000n;
  const fraction = String(n % billion).padStart(9, "0");
  const digits = Math.max(fraction.replace(/0+$/, "").length, 2);
  const number = `${n / billion}.${fraction.slice(0, digits)}`;
  switch (currency) {
    case "USD":
      return `$${number}`;
    case "EUR":
      return `€${number}`;
    case "GBP":
      return `£${number}`;
    case undefined:
    case null:
    case "":
      return number;
    default:
      return `${number} ${currency}`;
  }
}

// Milliseconds as `850ms`, `4s`, `4.5s`, `14m 10s` or `1h 2m 3s`.
export function duration(ms) {
  const n = Math.max(0, Math.floor(Number(ms) || 0));
  if (n < 1000) return `${n}ms`;
  if (n < 60000) {
    if (n % 1000 === 0) return `${n / 1000}s`;
    // An exact tie (x.25) rounds to the even tenth, as Rust's `{:.1}`
    // does; `toFixed` would round it up. Every other value both round
    // from the same binary number.
    return n % 1000 === 250 ? `${Math.floor(n / 1000)}.2s` : `${(n / 1000).toFixed(1)}s`;
  }
  const s = Math.floor(n / 1000);
  return [
    [Math.floor(s / 3600), "h"],
    [Math.floor((s % 3600) / 60), "m"],
    [s % 60, "s"],
  ]
    .filter(([v]) => v > 0)
    .map(([v, unit]) => `${v}${unit}`)
    .join(" ");
}

// A count with a comma between each group of three digits.
export function count(n) {
  return String(Math.max(0, Math.floor(Number(n) || 0))).replace(/\B(?=(\d{3})+(?!\d))/g, ",");
}

// A budget's amount of `kind` in its units (as `format_amount`).
export function amount(kind, n, currency) {
  if (kind === "wall_time") return duration(n);
  if (kind === "cost") return cost(n, currency);
  return count(n);
}

// Milliseconds since the Unix epoch as UTC, whole seconds.
export function utc(ms) {
  if (ms === null || ms === undefined || ms === "") return "";
  return new Date(Math.floor(Number(ms) / 1000) * 1000).toISOString().replace(/\.\d{3}Z$/, "Z");
}

// How far `ms` is from `now`: `in 4m 10s`, `3s ago`.
export function relative(ms, now = Date.now()) {
  const d = Number(ms) - now;
  return d >= 0 ? `in ${duration(d)}` : `${duration(-d)} ago`;
}
