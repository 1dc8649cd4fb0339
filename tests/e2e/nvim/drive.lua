-- A user's Neovim, headless: nvim-dap and tether's module on the runtimepath (as lazy.nvim's
-- `{ dir = ... }` puts them), `require('tether').setup()`, a breakpoint set with
-- toggle_breakpoint() in the file in the editor, then :DapContinue picking one of the module's
-- configurations by name (vim.ui.select answered as the user would). What happens is written to
-- $TETHER_NVIM_EVENTS, a JSON line each, for tests/e2e/test_nvim_e2e.py to assert on:
--   {"notify": TEXT, "error"?}  the module's and nvim-dap's notifications (an error ends Neovim)
--   {"stopped": REASON, "name", "line", "path", "locals": {NAME: VALUE}}   then it continues
--   {"exited": CODE}  {"terminated": true}  {"timeout": true}
-- Environment: TETHER_NVIM_RTP (the module's dir, nvim-dap's dir, ':'), TETHER_NVIM_TETHER (the
-- tether command), TETHER_NVIM_FILE and TETHER_NVIM_LINE (the breakpoint), TETHER_NVIM_PICK (the
-- configuration's name), TETHER_NVIM_RUN (an attach configuration's "run", if any).
local env = vim.env
local events = assert(io.open(env.TETHER_NVIM_EVENTS, 'a'))
local function say(event)
  events:write(vim.json.encode(event) .. '\n')
  events:flush()
end

for dir in vim.gsplit(env.TETHER_NVIM_RTP, ':', { plain = true }) do
  vim.opt.runtimepath:prepend(dir)
end
vim.cmd('runtime! plugin/dap.lua') -- what a plugin manager does at startup

local notify = vim.notify
vim.notify = function(text, level, opts)
  say({ notify = text, error = level == vim.log.levels.ERROR or nil })
  if level == vim.log.levels.ERROR then -- a refusal or a failure: nothing more will happen
    vim.schedule(function() vim.cmd('cquit 4') end)
  end
  return notify(text, level, opts)
end
vim.ui.select = function(items, opts, on_choice) -- the user picks the named configuration
  for i, item in ipairs(items) do
    local label = (opts.format_item or tostring)(item)
    if label == env.TETHER_NVIM_PICK then return on_choice(item, i) end
  end
  say({ notify = 'no choice named ' .. env.TETHER_NVIM_PICK })
  on_choice(nil, nil)
end

local dap = require('dap')
require('tether').setup({ tether = env.TETHER_NVIM_TETHER })
if env.TETHER_NVIM_RUN then -- an attach configuration naming its run
  table.insert(dap.configurations.python, {
    type = 'tether', request = 'attach', name = 'tether: attach by name', run = env.TETHER_NVIM_RUN,
  })
end

local function stopped(session, body)
  session:request('stackTrace', { threadId = body.threadId }, function(err, trace)
    assert(not err, vim.inspect(err))
    local top = trace.stackFrames[1]
    session:request('scopes', { frameId = top.id }, function(err2, scopes)
      assert(not err2, vim.inspect(err2))
      local ref = scopes.scopes[1].variablesReference
      session:request('variables', { variablesReference = ref }, function(err3, vars)
        assert(not err3, vim.inspect(err3))
        local locals = {}
        for _, v in ipairs(vars.variables) do locals[v.name] = v.value end
        say({ stopped = body.reason, name = top.name, line = top.line,
              path = top.source and top.source.path, locals = locals })
        dap.continue() -- :DapContinue on the stopped session
      end)
    end)
  end)
end
dap.listeners.after.event_stopped['tether-test'] = stopped
dap.listeners.after.event_exited['tether-test'] = function(_, body) say({ exited = body.exitCode }) end
dap.listeners.after.event_terminated['tether-test'] = function()
  say({ terminated = true })
  vim.defer_fn(function() vim.cmd('qall!') end, 200) -- the module's own listener stops serving
end

vim.cmd.edit(vim.fn.fnameescape(env.TETHER_NVIM_FILE))
if vim.bo.filetype == '' then vim.bo.filetype = 'python' end
vim.api.nvim_win_set_cursor(0, { tonumber(env.TETHER_NVIM_LINE), 0 })
dap.toggle_breakpoint() -- :DapToggleBreakpoint, before the run exists
vim.defer_fn(function()
  say({ timeout = true })
  vim.cmd('cquit 3')
end, 150000)
vim.cmd('DapContinue')
