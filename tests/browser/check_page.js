// Opens an HTML page from a file in headless Chromium (@sparticuz/chromium, driven by
// puppeteer-core) and prints what a test needs to judge it, as one JSON object: console errors,
// page errors, every request the page made, the charts it says it drew, and whether each canvas
// has paint on it. With a second argument, a full-page screenshot is written there.
// Usage: node check_page.js PAGE.html [SCREENSHOT.png]
'use strict';
const path = require('path');
const chromium = require('@sparticuz/chromium');
const puppeteer = require('puppeteer-core');

async function main() {
  const file = path.resolve(process.argv[2]);
  const shot = process.argv[3];
  const url = 'file://' + file;
  const browser = await puppeteer.launch({
    args: chromium.args,
    executablePath: await chromium.executablePath(),
    headless: true,
    defaultViewport: {width: 1200, height: 900},
  });
  const result = {consoleErrors: [], pageErrors: [], requests: [], failed: []};
  try {
    const page = await browser.newPage();
    page.on('console', (m) => { if (m.type() === 'error') result.consoleErrors.push(m.text()); });
    page.on('pageerror', (e) => result.pageErrors.push(String(e)));
    page.on('requestfailed', (r) => result.failed.push(r.url()));
    await page.setRequestInterception(true);
    page.on('request', (r) => {
      result.requests.push(r.url());
      // The page itself only: anything else would leave the file.
      if (r.url() === url) r.continue(); else r.abort();
    });
    await page.goto(url, {waitUntil: 'load'});
    result.chartsDrawn = await page.evaluate(
      () => Number(document.body.getAttribute('data-charts-drawn') || 0));
    result.canvases = await page.evaluate(() => Array.from(document.querySelectorAll('canvas'))
      .map((c) => {
        const ctx = c.getContext('2d');
        const pixels = ctx.getImageData(0, 0, c.width, c.height).data;
        let painted = 0;
        for (let i = 3; i < pixels.length; i += 4) if (pixels[i] !== 0) painted += 1;
        return {id: c.id, width: c.width, height: c.height, painted: painted};
      }));
    result.title = await page.title();
    if (shot) {
      // The whole page in the viewport first: Chart.js redraws a chart whose box resizes (a
      // full-page shot resizes the viewport), after the resize, not before the shot.
      const height = await page.evaluate(() => document.documentElement.scrollHeight);
      await page.setViewport({width: 1200, height: height});
      await new Promise((resolve) => setTimeout(resolve, 1000));
      await page.screenshot({path: shot, fullPage: true});
    }
  } finally {
    await browser.close();
  }
  process.stdout.write(JSON.stringify(result) + '\n');
}

main().catch((e) => { process.stderr.write(String(e && e.stack || e) + '\n'); process.exit(1); });
