// The seam between this course's code and the grader: one function per stage.
// The grader runs these in a Node.js process with THEINFERENCE_WEIGHTS set to the weights file.

import { forward, loadWeights, type Weights } from "../src/gpt2.ts";
import { ModelCache, decodeStep, generateCached, layerAttnIncremental, prefill, singleStepAttention } from "../src/kvcache.ts";

let weights: Weights | undefined;
function model(): Weights {
  weights ??= loadWeights(process.env.THEINFERENCE_WEIGHTS!);
  return weights;
}

/** seqIds: [n] -> [n][nVocab]: the logits at every position, by one full forward pass. */
export function runForward(seqIds: number[]): number[][] {
  return forward(model(), seqIds);
}

/** seqIds: [n] -> [nEmbd]: layer 0's attention-sublayer output at the last position, from the cache. */
export function runSingleStep(seqIds: number[]): number[] {
  return singleStepAttention(model(), seqIds);
}

/** seqIds: [n] -> [n][nEmbd]: layer 0's attention-sublayer output, incrementally from one cache. */
export function runLayerEquiv(seqIds: number[]): number[][] {
  return layerAttnIncremental(model(), seqIds);
}

/** -> [nVocab]: prefill promptIds, then one decode step of nextId at position promptIds.length. */
export async function runDecodeStep(promptIds: number[], nextId: number): Promise<number[]> {
  const w = model();
  const mc = new ModelCache(w.layers.length);
  prefill(promptIds, w, mc);
  return decodeStep(nextId, promptIds.length, w, mc);
}

/** -> [contIds.length][nVocab]: row k is the logits recorded before consuming contIds[k]. */
export async function runPerStepLogits(promptIds: number[], contIds: number[]): Promise<number[][]> {
  const w = model();
  const mc = new ModelCache(w.layers.length);
  let logits = prefill(promptIds, w, mc);
  const rows: number[][] = [];
  for (let k = 0; k < contIds.length; k++) {
    rows.push(logits);
    if (k + 1 < contIds.length) logits = decodeStep(contIds[k], promptIds.length + k, w, mc);
  }
  return rows;
}

/** -> nNew token ids, greedy (argmax) with the cache; no stop at <|endoftext|>. */
export function runGreedy(promptIds: number[], nNew: number): number[] {
  return generateCached(model(), promptIds, nNew);
}
