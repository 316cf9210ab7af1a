// Keys and values kept per layer: a new token attends to them instead of recomputing them.

import { NotImplementedError, add, attention, embed, ffn, layerNorm, linear, logits, splitQkv, type Layer, type Weights, argmax } from "./gpt2.ts";

/** One layer's keys and values; room doubles when it runs out, so appending a row is cheap on average. */
export class LayerCache {
  k = new Float32Array(0);
  v = new Float32Array(0);
  length = 0;

  append(k: Float32Array, v: Float32Array, n: number): void {
    const width = k.length / n;
    const needed = (this.length + n) * width;
    if (needed > this.k.length) {
      const room = Math.max(needed, 2 * this.k.length);
      const nk = new Float32Array(room);
      nk.set(this.k.subarray(0, this.length * width));
      this.k = nk;
      const nv = new Float32Array(room);
      nv.set(this.v.subarray(0, this.length * width));
      this.v = nv;
    }
    this.k.set(k, this.length * width);
    this.v.set(v, this.length * width);
    this.length += n;
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

// Attention of the new rows over every cached row (their own keys and values appended first).
export function attnCached(x: Float32Array, n: number, layer: Layer, nHead: number, cache: LayerCache): Float32Array {
  const [q, keys, vals] = splitQkv(linear(x, n, layer.cAttn), n);
  cache.append(keys, vals, n);
  const mixed = attention(q, cache.k, cache.v, n, cache.length, nHead);
  return linear(mixed, n, layer.cProj);
}

// The new rows through every layer; only the last row goes through the LM head.
export function forwardCached(w: Weights, ids: number[], cache: ModelCache, start: number): number[][] {
  let h = embed(w, ids, start);
  for (let l = 0; l < w.layers.length; l++) {
    const blk = w.layers[l];
    h = add(h, attnCached(layerNorm(h, ids.length, blk.ln1), ids.length, blk, w.nHead, cache.layers[l]));
    h = add(h, ffn(layerNorm(h, ids.length, blk.ln2), ids.length, blk));
  }
  const lastRow = h.slice((ids.length - 1) * w.nEmbd);
  return logits(w, lastRow, 1);
}

/** Run the prompt once, filling the (fresh) cache -> the logits of its last position. */
export function prefill(ids: number[], w: Weights, cache: ModelCache): number[] {
  return forwardCached(w, ids, cache, 0)[0];
}

/** Consume one token at position pos (== cache.length) -> its logits [nVocab]. */
export function decodeStep(tokenId: number, pos: number, w: Weights, cache: ModelCache): number[] {
  return forwardCached(w, [tokenId], cache, pos)[0];
}

/** The first layer's attention sublayer for the last token, the earlier tokens fed one at a time. */
export function singleStepAttention(w: Weights, ids: number[]): number[] {
  const blk = w.layers[0];
  const kv = new LayerCache();
  const n = ids.length;
  for (let pos = 0; pos < n - 1; pos++) {
    const e = embed(w, [ids[pos]], pos);
    attnCached(layerNorm(e, 1, blk.ln1), 1, blk, w.nHead, kv);
  }
  const last = embed(w, [ids[n - 1]], n - 1);
  const out = add(last, attnCached(layerNorm(last, 1, blk.ln1), 1, blk, w.nHead, kv));
  return Array.from(out);
}

/** The first layer's attention sublayer at every position, each from the cache the earlier ones filled. */
export function layerAttnIncremental(w: Weights, ids: number[]): number[][] {
  const blk = w.layers[0];
  const kv = new LayerCache();
  const rows: number[][] = [];
  for (let pos = 0; pos < ids.length; pos++) {
    const e = embed(w, [ids[pos]], pos);
    rows.push(Array.from(add(e, attnCached(layerNorm(e, 1, blk.ln1), 1, blk, w.nHead, kv))));
  }
  return rows;
}

/** Argmax decoding: the prompt once, then one token at a time through the cache. */
export function generateCached(w: Weights, ids: number[], nNew: number): number[] {
  const cache = new ModelCache(w.layers.length);
  const tokens: number[] = [];
  if (nNew <= 0) return tokens;
  let scores = prefill(ids, w, cache);
  for (;;) {
    const next = argmax(scores);
    tokens.push(next);
    if (tokens.length >= nNew) return tokens;
    scores = decodeStep(next, cache.length, w, cache);
  }
}
