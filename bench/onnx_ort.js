// Times an ONNX model in ONNX Runtime (onnxruntime-node): 2 intra-op
// threads, all graph optimizations, batch 1.
// usage: node onnx_ort.js MODEL INPUT.bin D1,D2,… OUTPUT.bin ROUNDS
// Prints {"median_ms": …} and writes the output as raw float32.
const fs = require('fs');
const ort = require('onnxruntime-node');

(async () => {
  const [model, input, dims, output, rounds] = process.argv.slice(2);
  const s = await ort.InferenceSession.create(model, {
    intraOpNumThreads: 2, interOpNumThreads: 1, graphOptimizationLevel: 'all', executionMode: 'sequential',
  });
  const buf = fs.readFileSync(input);
  const data = new Float32Array(buf.buffer, buf.byteOffset, buf.byteLength / 4);
  const feeds = {[s.inputNames[0]]: new ort.Tensor('float32', data, dims.split(',').map(Number))};
  let out;
  for (let i = 0; i < 2; i++) out = await s.run(feeds);
  const times = [];
  for (let i = 0; i < Number(rounds); i++) {
    const t0 = process.hrtime.bigint();
    out = await s.run(feeds);
    times.push(Number(process.hrtime.bigint() - t0) / 1e6);
  }
  times.sort((a, b) => a - b);
  const y = out[s.outputNames[0]].data;
  fs.writeFileSync(output, Buffer.from(y.buffer, y.byteOffset, y.byteLength));
  console.log(JSON.stringify({median_ms: times[Math.floor(times.length / 2)]}));
})().catch((e) => { console.error(String(e)); process.exit(1); });
