// The console in a real browser: Playwright (playwright-core) driving Debian's headless
// Chromium against a local runner seeded with tasks in every state. Run by tests/console.rs,
// which passes:
//   CONSOLE_URL    the console's address (http://127.0.0.1:PORT/console)
//   CONSOLE_TASKS  {"State": [task ids]} of the seeded tasks
//   CONSOLE_TRIAGE {"processed": id, "refused": id}: tasks of order-triage, a workflow with a
//                  choice and a condition
//   CONSOLE_SEARCH {"key": "name:value", "found": [ids, newest first]}: tasks a search key finds
//   CONSOLE_SHOTS  the folder for screenshots
//   CHROMIUM       the browser (default /usr/bin/chromium)
// Exits non-zero on the first expectation that fails.
import { chromium } from 'playwright-core';
import assert from 'node:assert/strict';
import path from 'node:path';

const base = process.env.CONSOLE_URL;
const tasks = JSON.parse(process.env.CONSOLE_TASKS);
const triage = JSON.parse(process.env.CONSOLE_TRIAGE);
const search = JSON.parse(process.env.CONSOLE_SEARCH);
const shots = process.env.CONSOLE_SHOTS;
const shot = (page, name) => page.screenshot({ path: path.join(shots, name), fullPage: true });

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
  // Root in a sandbox, on a closed network: no sandbox-in-sandbox, no background calls home.
  args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
    '--disable-background-networking', '--disable-component-update', '--disable-sync'],
});
try {
  const page = await browser.newPage({ viewport: { width: 1280, height: 860 } });
  page.setDefaultTimeout(10_000);
  const heading = () => page.getByRole('heading', { level: 1 }).innerText();
  const rows = () => page.locator('table.tasks tbody tr');

  // The list opens on the failed tasks.
  await page.goto(base);
  assert.equal(await heading(), 'Error tasks');
  assert.equal(await rows().count(), tasks.Error.length);

  // Filter by state: the Processed tab, with its count.
  const states = page.getByRole('navigation', { name: 'States' });
  const processedTab = states.getByRole('link', { name: /^Processed \d+/ });
  assert.match(await processedTab.innerText(), new RegExp(`Processed\\s+${tasks.Processed.length}`));
  await processedTab.click();
  assert.equal(await heading(), 'Processed tasks');
  assert.equal(await rows().count(), tasks.Processed.length);
  assert.equal(await states.locator('[aria-current="page"]').innerText().then((t) => t.split(/\s/)[0]), 'Processed');

  // And by workflow: only the loan stays.
  await page.getByLabel('Workflow').selectOption('loan-application');
  await page.getByRole('button', { name: 'Show' }).click();
  assert.equal(await heading(), 'Processed tasks of loan-application');
  assert.equal(await rows().count(), 1);
  assert.equal(await rows().first().locator('td').nth(1).innerText(), 'loan-application');
  await shot(page, 'tasks.png');

  // A task's page: the steps as a timeline, inputs and results one click away.
  const failed = tasks.CompensationFailed[0];
  await page.goto(`${base}?state=CompensationFailed`);
  await page.getByRole('link', { name: failed }).click();
  assert.match(await heading(), new RegExp(`^Task ${failed}`));
  const steps = page.locator('ol.timeline > li');
  assert.equal(await steps.count(), 3);
  assert.match(await steps.nth(0).innerText(), /reserve-inventory[\s\S]*inventory\.reserve-inventory[\s\S]*Done[\s\S]*undo[\s\S]*Failed/);
  assert.match(await steps.nth(1).innerText(), /charge-payment[\s\S]*Failed/);
  const result = steps.nth(0).locator('details').filter({ has: page.getByText('Result', { exact: true }) });
  assert.equal(await result.locator('pre').isVisible(), false, 'closed until asked for');
  await result.getByText('Result', { exact: true }).click();
  assert.match(await result.locator('pre').innerText(), /"id"/);
  const history = page.locator('table.history tbody tr');
  assert.ok(await history.count() >= 5, 'the history is shown');
  await shot(page, 'task.png');

  // A retry from the page: confirm with a reason, and the task moves.
  const error = tasks.Error[0];
  await page.goto(`${base}/tasks/${error}`);
  assert.match(await page.locator('h1 .badge').innerText(), /^Error$/);
  await page.getByRole('link', { name: 'Retry…' }).click();
  assert.match(await heading(), /^Retry task/);
  await page.getByLabel('Reason (recorded in the history)').fill('retried from the browser');
  await shot(page, 'confirm.png');
  await page.getByRole('button', { name: 'Retry task' }).click();
  assert.match(await page.getByRole('status').innerText(), /Retry applied: the task is now Pending/);
  assert.match(await page.locator('h1 .badge').innerText(), /^Pending$/);
  assert.match(await page.locator('table.history tbody tr').last().innerText(), /operator retry: retried from the browser/);
  await shot(page, 'retried.png');

  // The resolve form will not go without its note.
  const other = tasks.CompensationFailed[0];
  await page.goto(`${base}/tasks/${other}/resolve`);
  await page.getByRole('button', { name: 'Resolve task' }).click();
  assert.match(await heading(), /^Resolve task/, 'the browser keeps a required note');

  // The services and their breakers; the workflows and their versions.
  await page.getByRole('link', { name: 'Services' }).click();
  assert.equal(await heading(), 'Services');
  const bank = () => page.getByRole('row').filter({ has: page.getByRole('cell', { name: 'core-banking', exact: true }) });
  assert.match(await bank().innerText(), /closed/);
  // Pause a service with its reason, then resume it.
  await page.getByLabel('Why pause core-banking').fill('bank maintenance');
  await bank().getByRole('button', { name: 'Pause' }).click();
  assert.equal(await heading(), 'Services');
  assert.match(await bank().innerText(), /paused[\s\S]*bank maintenance/);
  await shot(page, 'services.png');
  await bank().getByRole('button', { name: 'Resume' }).click();
  assert.match(await bank().innerText(), /closed/);
  await page.getByRole('link', { name: 'Workflows' }).click();
  await page.getByRole('link', { name: 'loan-application' }).click();
  assert.match(await heading(), /^Workflow loan-application v\d+/);

  // A workflow with parallel branches, a choice in one and a condition in the other, drawn as a
  // graph on its page: a node per step in order, the branches and the cases side by side, no
  // statuses.
  await page.goto(`${base}/workflows/order-triage`);
  const graph = page.locator('figure.graph svg.workflow-graph');
  assert.ok(await graph.isVisible(), 'the graph is drawn');
  const triageSteps = ['reserve-inventory', 'pick-items', 'check-credit', 'charge-card', 'send-invoice', 'express-booking', 'pack-order', 'label-items', 'arrange-shipping'];
  const stepsOf = (svg) => svg.locator('g.node').evaluateAll((ns) => ns.map((n) => n.dataset.step));
  assert.deepEqual(await stepsOf(graph), triageSteps);
  assert.equal(await graph.locator('[data-status]').count(), 0, 'no task, no statuses');
  assert.deepEqual(await graph.locator('g.lane[data-group="prepare"] text').allTextContents(), ['pay', 'pack']);
  assert.deepEqual(await graph.locator('g.lane[data-group="payment"] text').allTextContents(), ['when input.amount > 500', 'otherwise']);
  assert.match(await graph.locator('g.node[data-step="express-booking"]').textContent(), /when input\.express/);
  await shot(page, 'workflow.png');

  // The refused task's page: its path through the same graph. The card case ran (the invoice is
  // greyed, skipped), the express booking was skipped, the packing done, the shipping refused;
  // the packing, the charge and the reservation undone.
  await page.goto(`${base}/tasks/${triage.refused}`);
  const trail = page.locator('figure.graph svg.workflow-graph');
  assert.deepEqual(await stepsOf(trail), triageSteps);
  const node = (step) => trail.locator(`g.node[data-step="${step}"]`);
  const want = { 'reserve-inventory': 'Done', 'pick-items': 'Done', 'check-credit': 'Done', 'charge-card': 'Done',
    'send-invoice': 'Skipped', 'express-booking': 'Skipped', 'pack-order': 'Done', 'label-items': 'Done', 'arrange-shipping': 'Failed' };
  for (const [step, status] of Object.entries(want)) {
    assert.equal(await node(step).getAttribute('data-status'), status, step);
    // Colour is never the only signal: the status is said in the box.
    assert.match(await node(step).locator('text.status').textContent(), new RegExp(`${status}$`), step);
  }
  for (const step of ['send-invoice', 'express-booking']) {
    assert.match(await node(step).getAttribute('class'), /\bk-skip\b/, `${step} is greyed`);
  }
  assert.equal(await trail.locator('g.lane[data-group="payment"][data-arm="0"]').getAttribute('data-taken'), 'true');
  assert.equal(await trail.locator('g.lane[data-group="payment"][data-arm="1"]').getAttribute('data-taken'), 'false');
  assert.equal(await node('pack-order').locator('text.undo-status').textContent(), 'undo ✓ Done');
  // The forEach's elements, each with its status and its undo, on the same page.
  // (The items picked, on the main line, then labelled, in the packing branch.)
  for (const list of await page.locator('p.elements').all()) {
    assert.match(await list.innerText(), /^3 elements: #0 Done undo Done #1 Done undo Done #2 Done undo Done/);
  }
  assert.equal(await page.locator('p.elements').count(), 2);
  assert.equal(await node('charge-card').locator('text.undo').textContent(), '↶ undo refund-payment');
  assert.equal(await node('charge-card').locator('text.undo-status').textContent(), 'undo ✓ Done');
  assert.ok(await trail.locator('path.edge.taken').count() >= 5, 'the path is drawn');
  assert.equal(await trail.locator('g.terminal.end.reached').count(), 0, 'a refused task did not reach the end');
  // The failed step's box has the colour of the timeline's Failed badge.
  const stroke = await node('arrange-shipping').locator('rect.box').evaluate((r) => getComputedStyle(r).stroke);
  const failedBadge = page.locator('ol.timeline .badge.bad').first();
  assert.equal(stroke, await failedBadge.evaluate((b) => getComputedStyle(b).color));
  await page.locator('figure.graph').screenshot({ path: path.join(shots, 'graph.png') });

  // The processed task went to the end, by invoice and express.
  await page.goto(`${base}/tasks/${triage.processed}`);
  assert.equal(await trail.locator('g.terminal.end.reached').count(), 1);
  assert.equal(await node('express-booking').getAttribute('data-status'), 'Done');
  assert.equal(await node('charge-card').getAttribute('data-status'), 'Skipped');

  // The search box: the tasks a key finds, in every state, newest first; a task's page links
  // its keys back to their search.
  await page.goto(base);
  await page.getByRole('searchbox', { name: 'Find by key' }).fill(search.key);
  await page.getByRole('button', { name: 'Find' }).click();
  assert.equal(await heading(), `Tasks found by ${search.key}`);
  const found = await rows().locator('td:first-child a').allInnerTexts();
  assert.deepEqual(found, search.found);
  assert.equal(await page.getByRole('navigation', { name: 'States' }).locator('[aria-current="page"]').count(), 0, 'a search is in no one state');
  // Narrowed to a workflow, the search stays.
  await page.getByLabel('Workflow').selectOption('ledger-posting');
  await page.getByRole('button', { name: 'Show' }).click();
  assert.equal(await heading(), `Tasks of ledger-posting found by ${search.key}`);
  assert.deepEqual(await rows().locator('td:first-child a').allInnerTexts(), search.found);
  await shot(page, 'search.png');
  await page.getByRole('link', { name: search.found[0] }).click();
  // The newest waits at its gate (one at a time per account) behind the other.
  const gate = page.locator('dt', { hasText: /^Gate$/ }).locator('xpath=following-sibling::dd[1]');
  assert.match(await gate.innerText(), /\(InLine, limit 1\); 1 before it/);
  // It was submitted urgent: its page says so; the other's says nothing of priority.
  const priority = page.locator('dt', { hasText: /^Priority$/ }).locator('xpath=following-sibling::dd[1]');
  assert.match(await priority.innerText(), /^urgent/);
  await page.getByRole('link', { name: search.key }).click();
  assert.equal(await heading(), `Tasks found by ${search.key}`);
  assert.equal(await rows().count(), search.found.length);
  await page.getByRole('link', { name: search.found[1] }).click();
  assert.equal(await page.locator('dt', { hasText: /^Priority$/ }).count(), 0, 'a normal task shows no priority');
  console.log('console browser test: ok');
} finally {
  await browser.close();
}
