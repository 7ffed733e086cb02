// Numbers and durations for a person, as the keyqueue commands write them
// (keyqueue/_console/format.py: number, count, counted, numbered, duration),
// so a state reads the same on a page and in `keyqueue top`: thousands
// separators, never an exponent, ties rounded to even on the number's exact
// binary value, as Python's round() does. Both pages' app.js import it.

// x (finite, >= 0) as an exact integer mantissa and a power of two: x = m * 2 ** e.
function exactly(x) {
  const view = new DataView(new ArrayBuffer(8));
  view.setFloat64(0, x);
  const high = view.getUint32(0);
  const biased = (high >>> 20) & 0x7ff;
  let m = (BigInt(high & 0xfffff) << 32n) | BigInt(view.getUint32(4));
  if (biased !== 0) m |= 1n << 52n;
  return [m, (biased || 1) - 1075];
}

// |x| rounded to `decimals` places (negative: to tens, hundreds, ...), ties to even,
// as a whole number of units of 10 ** -decimals: Python's round(abs(x), decimals).
function units(x, decimals) {
  const [m, e] = exactly(Math.abs(x));
  let num = e >= 0 ? m << BigInt(e) : m;
  let den = e >= 0 ? 1n : 1n << BigInt(-e);
  if (decimals >= 0) num *= 10n ** BigInt(decimals);
  else den *= 10n ** BigInt(-decimals);
  const whole = num / den;
  const twice = 2n * (num % den);
  return twice > den || (twice === den && whole % 2n === 1n) ? whole + 1n : whole;
}

// "1234567" -> "1,234,567".
function grouped(digits) {
  return digits.replace(/\B(?=(\d{3})+(?!\d))/g, ",");
}

// Python's round(x), a whole number (ties to even).
function rounded(x) {
  const n = Number(units(x, 0));
  return x < 0 ? -n : n;
}

// x to `digits` significant digits, without trailing zeros or an exponent:
// 4, 0.0125, 2.5, 3,600, 1,000,000,000,000.
export function number(x, digits = 6) {
  if (x === 0) return Object.is(x, -0) ? "-0" : "0";
  if (!Number.isFinite(x)) return Number.isNaN(x) ? "nan" : x > 0 ? "inf" : "-inf";
  const decimals = digits - 1 - Math.floor(Math.log10(Math.abs(x)));
  const text = units(x, decimals).toString();
  let shown;
  if (decimals > 0) {
    const padded = text.padStart(decimals + 1, "0");
    const point = padded.length - decimals;
    shown = `${grouped(padded.slice(0, point))}.${padded.slice(point)}`.replace(/\.?0+$/, "");
  } else {
    shown = grouped(text + "0".repeat(-decimals));
  }
  return x < 0 ? `-${shown}` : shown;
}

// A whole number: 12,345.
export function count(n) {
  const whole = rounded(n);
  return whole < 0 ? `-${grouped(String(-whole))}` : grouped(String(whole));
}

// n as count writes it, and the noun that agrees with it: "1 key", "2 keys", "1,000 keys".
export function counted(n, one, many = `${one}s`) {
  return `${count(n)} ${rounded(n) === 1 ? one : many}`;
}

// x as number writes it, and the noun that agrees with it: "1 step", "2.5 steps".
export function numbered(x, one, many = `${one}s`, digits = 6) {
  const text = number(x, digits);
  return `${text} ${text === "1" ? one : many}`;
}

// A short duration: 5ms, 250ms, 1.5s, 16m40s, 2h5m, 27,777h46m (-1.5s before 0).
export function duration(seconds) {
  if (seconds < 0) return `-${duration(-seconds)}`;
  if (seconds < 0.001) return seconds ? `${number(seconds * 1e6, 3)}µs` : "0s";
  if (seconds < 1) return `${number(seconds * 1000, 3)}ms`;
  if (seconds < 60) return `${number(seconds, 3)}s`;
  const whole = rounded(seconds);
  const secs = whole % 60;
  let minutes = (whole - secs) / 60;
  if (minutes < 60) return secs ? `${minutes}m${secs}s` : `${minutes}m`;
  const hours = Math.floor(minutes / 60);
  minutes -= hours * 60;
  return minutes ? `${count(hours)}h${minutes}m` : `${count(hours)}h`;
}
