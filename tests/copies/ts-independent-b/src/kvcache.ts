// Coursework: the cache, so that generating does not redo the whole prompt for every token.

import { NotImplementedError, add, attention, embed, ffn, layerNorm, linear, logits, splitQkv, type Layer, type Weights, argmax } from "./gpt2.ts";

const CHUNK = 64; // rows reserved at a time

/** The keys and values one layer has seen, in buffers reserved CHUNK rows at a time. */
export class LayerCache {
  k = new Float32Array(0);
  v = new Float32Array(0);
  length = 0;

  append(k: Float32Array, v: Float32Array, n: number): void {
    const e = k.length / n;
    const rows = this.length + n;
    if (rows * e > this.k.length) {
      const reserve = Math.ceil(rows / CHUNK) * CHUNK * e;
      const k2 = new Float32Array(reserve);
      const v2 = new Float32Array(reserve);
      k2.set(this.k);
      v2.set(this.v);
      [this.k, this.v] = [k2, v2];
    }
    this.k.set(k, this.length * e);
    this.v.set(v, this.length * e);
    this.length = rows;
  }
}

export class ModelCache {
  layers: LayerCache[];
  constructor(nLayer: number) {
    this.layers = Array.from({ length: nLayer }, () => new LayerCache());
  }
  get length(): number {
    return this.layers[0].length;
  }
}

export function attnCached(x: Float32Array, n: number, layer: Layer, nHead: number, cache: LayerCache): Float32Array {
  const projected = linear(x, n, layer.cAttn);
  const parts = splitQkv(projected, n);
  cache.append(parts[1], parts[2], n);
  return linear(attention(parts[0], cache.k, cache.v, n, cache.length, nHead), n, layer.cProj);
}

export function forwardCached(w: Weights, ids: number[], cache: ModelCache, start: number): number[][] {
  const count = ids.length;
  let state = embed(w, ids, start);
  let index = 0;
  for (const layer of w.layers) {
    const attended = attnCached(layerNorm(state, count, layer.ln1), count, layer, w.nHead, cache.layers[index++]);
    const mid = add(state, attended);
    state = add(mid, ffn(layerNorm(mid, count, layer.ln2), count, layer));
  }
  const final = new Float32Array(w.nEmbd);
  final.set(state.subarray((count - 1) * w.nEmbd));
  return logits(w, final, 1);
}

/** Run the prompt once, filling the (fresh) cache -> the logits of its last position. */
export function prefill(ids: number[], w: Weights, cache: ModelCache): number[] {
  return forwardCached(w, ids, cache, 0)[0];
}

/** Consume one token at position pos (== cache.length) -> its logits [nVocab]. */
export function decodeStep(tokenId: number, pos: number, w: Weights, cache: ModelCache): number[] {
  return forwardCached(w, [tokenId], cache, pos)[0];
}

export function singleStepAttention(w: Weights, ids: number[]): number[] {
  const first = w.layers[0];
  const store = new LayerCache();
  const sub = (rows: Float32Array, count: number) =>
    add(rows, attnCached(layerNorm(rows, count, first.ln1), count, first, w.nHead, store));
  const before = ids.length - 1;
  if (before > 0) sub(embed(w, ids.slice(0, before)), before);
  return Array.from(sub(embed(w, [ids[before]], before), 1));
}

export function layerAttnIncremental(w: Weights, ids: number[]): number[][] {
  const first = w.layers[0];
  const store = new LayerCache();
  const out: number[][] = new Array(ids.length);
  ids.forEach((tok, p) => {
    const row = embed(w, [tok], p);
    const mixed = attnCached(layerNorm(row, 1, first.ln1), 1, first, w.nHead, store);
    out[p] = Array.from(add(row, mixed));
  });
  return out;
}

export function generateCached(w: Weights, ids: number[], nNew: number): number[] {
  const mc = new ModelCache(w.layers.length);
  const produced: number[] = [];
  let candidate = nNew > 0 ? argmax(prefill(ids, w, mc)) : -1;
  while (produced.length < nNew) {
    produced.push(candidate);
    if (produced.length < nNew) candidate = argmax(decodeStep(candidate, ids.length + produced.length - 1, w, mc));
  }
  return produced;
}
