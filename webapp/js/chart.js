// A uPlot time-series chart built once and fed new data in place (no flicker on refresh).
import { useEffect, useRef } from 'preact/hooks';
import uPlot from 'uplot';
import { html } from './ui.js';

const COLORS = ['#5b3cc4', '#2e9d6b', '#d9822b', '#c62828'];

export function TimeChart({ series, data, height = 200, testid, right }) {
  // right: the label of one series drawn against its own scale on the right axis (e.g. seconds)
  const box = useRef(null);
  const plot = useRef(null);
  useEffect(() => {
    const el = box.current;
    const opts = {
      width: Math.max(el.clientWidth, 300), height,
      legend: { live: false },
      cursor: { drag: { x: false, y: false } },
      scales: { x: { time: true } },
      axes: [{ stroke: '#6b7385', grid: { stroke: '#eef0f4' } }, { stroke: '#6b7385', grid: { stroke: '#eef0f4' }, size: 50 },
        ...(right ? [{ scale: 'right', side: 1, stroke: COLORS[series.indexOf(right)], grid: { show: false }, size: 50 }] : [])],
      series: [{}, ...series.map((label, i) => ({ label, scale: label === right ? 'right' : 'y', stroke: COLORS[i % COLORS.length], width: 2, spanGaps: false,
        fill: i === 0 ? 'rgba(91,60,196,0.08)' : undefined, points: { show: false } }))],
    };
    plot.current = new uPlot(opts, data, el);
    const ro = new ResizeObserver(() => plot.current && plot.current.setSize({ width: Math.max(el.clientWidth, 300), height }));
    ro.observe(el);
    return () => { ro.disconnect(); plot.current.destroy(); plot.current = null; };
  }, []);
  useEffect(() => { if (plot.current) plot.current.setData(data); }, [data]);
  return html`<div class="chart" ref=${box} data-testid=${testid}></div>`;
}

// /status/analytics series -> uPlot columns [[t...], [a...], [b...]]
// (a negative value, from clock skew between replicas, is drawn as 0)
export function columns(rows, keys) {
  const t = rows.map((r) => new Date(r.time).getTime() / 1000);
  return [t, ...keys.map((k) => rows.map((r) => (r[k] === null || r[k] === undefined ? null : Math.max(0, Number(r[k])))))];
}
