// The KV cache: keep every layer's keys and values, so each new token costs one row.

import { add, attention, embed, ffn, layerNorm, linear, logits, splitQkv, type Layer, type Weights, argmax } from "./gpt2.ts";

/** Keys and values of one layer, [length, nEmbd] each, grown a block of rows at a time. */
export class LayerCache {
  k = new Float32Array(0);
  v = new Float32Array(0);
  length = 0;

  append(k: Float32Array, v: Float32Array, n: number): void {
    const grow = (old: Float32Array, rows: Float32Array) => {
      const next = new Float32Array(old.length + rows.length);
      next.set(old);
      next.set(rows, old.length);
      return next;
    };
    this.k = grow(this.k, k);
    this.v = grow(this.v, v);
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

// New rows [n, nEmbd] (already layer-normed) -> the attention output [n, nEmbd], their k/v added to the cache
export function attnCached(x: Float32Array, n: number, layer: Layer, nHead: number, cache: LayerCache): Float32Array {
  const [q, k, v] = splitQkv(linear(x, n, layer.cAttn), n);
  cache.append(k, v, n);
  const out = attention(q, cache.k, cache.v, n, cache.length, nHead);
  return linear(out, n, layer.cProj);
}

// New rows ids at positions start.., each layer through its cache -> the logits of the last new row only, as one row
// [1][nVocab] (prefill and decodeStep read its [0]; the LM head on every row would hand prefill the first position's)
export function forwardCached(w: Weights, ids: number[], cache: ModelCache, start: number): number[][] {
  const n = ids.length;
  let x = embed(w, ids, start);
  w.layers.forEach((layer, i) => {
    x = add(x, attnCached(layerNorm(x, n, layer.ln1), n, layer, w.nHead, cache.layers[i]));
    x = add(x, ffn(layerNorm(x, n, layer.ln2), n, layer));
  });
  return logits(w, x.subarray((n - 1) * w.nEmbd), 1);
}

/** Run the prompt once, filling the (fresh) cache -> the logits of its last position. */
export function prefill(ids: number[], w: Weights, cache: ModelCache): number[] {
  return forwardCached(w, ids, cache, 0)[0];
}

/** Consume one token at position pos (== cache.length) -> its logits [nVocab]. */
export function decodeStep(tokenId: number, pos: number, w: Weights, cache: ModelCache): number[] {
  return forwardCached(w, [tokenId], cache, pos)[0];
}

/** Layer 0's attention sublayer at the last position only, from a cache of the earlier ones -> [nEmbd]. */
export function singleStepAttention(w: Weights, ids: number[]): number[] {
  const layer = w.layers[0];
  const cache = new LayerCache();
  if (ids.length > 1) {
    const earlier = embed(w, ids.slice(0, -1), 0);
    attnCached(layerNorm(earlier, ids.length - 1, layer.ln1), ids.length - 1, layer, w.nHead, cache);
  }
  const x = embed(w, ids.slice(-1), ids.length - 1);
  return Array.from(add(x, attnCached(layerNorm(x, 1, layer.ln1), 1, layer, w.nHead, cache)));
}

/** Layer 0's attention sublayer, one position at a time from one fresh cache -> [n][nEmbd]. */
export function layerAttnIncremental(w: Weights, ids: number[]): number[][] {
  const layer = w.layers[0];
  const cache = new LayerCache();
  return ids.map((token, pos) => {
    const x = embed(w, [token], pos);
    return Array.from(add(x, attnCached(layerNorm(x, 1, layer.ln1), 1, layer, w.nHead, cache)));
  });
}

/** Greedy decoding with the cache: one prefill, then one row per token. */
export function generateCached(w: Weights, ids: number[], nNew: number): number[] {
  const cache = new ModelCache(w.layers.length);
  const out = [argmax(prefill(ids, w, cache))];
  while (out.length < nNew) out.push(argmax(decodeStep(out[out.length - 1], cache.length, w, cache)));
  return out.slice(0, nNew);
}
