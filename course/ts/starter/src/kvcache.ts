// The KV cache: keep every layer's keys and values, so each new token costs one row.

import { NotImplementedError, add, attention, embed, ffn, layerNorm, linear, logits, splitQkv, type Layer, type Weights, argmax } from "./gpt2.ts";

/** Keys and values of one layer, [length, nEmbd] each, grown a block of rows at a time. */
export class LayerCache {
  k = new Float32Array(0);
  v = new Float32Array(0);
  length = 0;

  append(k: Float32Array, v: Float32Array, n: number): void {
    throw new NotImplementedError("LayerCache.append"); // TODO: add n rows of k and v after the cached ones
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
  throw new NotImplementedError("attnCached"); // TODO: q, k, v of the new rows; append k, v to the cache; attend over everything cached; c_proj
}

// New rows ids at positions start.., each layer through its cache -> the logits of the last new row only, as one row
// [1][nVocab] (prefill and decodeStep read its [0]; the LM head on every row would hand prefill the first position's)
export function forwardCached(w: Weights, ids: number[], cache: ModelCache, start: number): number[][] {
  throw new NotImplementedError("forwardCached"); // TODO: forward() over the new rows only, each layer through its cache; the LM head on the last row only: [1][nVocab]
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
  throw new NotImplementedError("singleStepAttention"); // TODO: cache the earlier positions' k/v, then layer 0's sublayer output x + attn(ln_1(x)) at the last
}

/** Layer 0's attention sublayer, one position at a time from one fresh cache -> [n][nEmbd]. */
export function layerAttnIncremental(w: Weights, ids: number[]): number[][] {
  throw new NotImplementedError("layerAttnIncremental"); // TODO: one position at a time through one fresh LayerCache
}

/** Greedy decoding with the cache: one prefill, then one row per token. */
export function generateCached(w: Weights, ids: number[], nNew: number): number[] {
  throw new NotImplementedError("generateCached"); // TODO: prefill, then argmax and decodeStep until nNew tokens
}
