-- What a `tether` nvim-dap configuration means, with no Neovim in it (tested by
-- tests/unit/test_nvim_module.py under plain Lua, and in Neovim by tests/e2e/test_nvim_e2e.py):
-- the `tether` command line that submits the run
-- (launch), reruns it or finds it (attach), and serves its adapter on 127.0.0.1, printing one JSON
-- line {"run": ID, "port": P} once it serves. The same meaning as the VS Code extension's launch.js.
local M = {}

local unpack = table.unpack or unpack -- Neovim's LuaJIT has only the global

local ONE = {
  { 'backend', '--backend' }, { 'gpus', '--gpus' }, { 'cpus', '--cpus' }, { 'mem', '--mem' },
  { 'nodes', '--nodes' }, { 'gpusPerNode', '--gpus-per-node' }, { 'cpusPerNode', '--cpus-per-node' },
  { 'time', '--time' }, { 'partition', '--partition' }, { 'runName', '--name' },
  { 'maxRetries', '--max-retries' }, { 'processes', '--processes' }, { 'ranks', '--ranks' },
  { 'debugWhen', '--debug-when' }, { 'preemptGrace', '--preempt-grace' },
  { 'keepCheckpoints', '--keep-checkpoints' },
  { 'onUnattendedStop', '--on-unattended-stop' }, { 'unattendedFallback', '--unattended-fallback' },
  { 'fromCheckpoint', '--from-checkpoint' },
}
local MANY = {
  { 'tags', '--tag' }, { 'metrics', '--metric' }, { 'resources', '--resource' }, { 'outputs', '--outputs' },
}
local SERVING = { '--port', '0', '--json', '-q' }

local function append(list, ...)
  for _, item in ipairs({ ... }) do
    list[#list + 1] = item
  end
end

local function relay_options(argv, config)
  if config.profile then append(argv, '--profile', config.profile) end
  if config.relay then append(argv, '--relay', config.relay) end
end

--- `program` relative to `workdir`, or nil and why (only the workdir is snapshotted)
function M.relative(program, workdir)
  local dir = workdir:gsub('/+$', '')
  if program:sub(1, 1) ~= '/' then program = dir .. '/' .. program end
  local prefix = dir .. '/'
  if program:sub(1, #prefix) ~= prefix or program:find('/%.%./') then
    return nil, ('"program" (%s) must be inside the workdir (%s): only the workdir is snapshotted')
      :format(program, dir)
  end
  return program:sub(#prefix + 1)
end

--- The `tether` arguments for a configuration; or nil and a message saying what is wrong.
function M.argv(config, cwd)
  local argv = {}
  if config.request == 'attach' then
    if type(config.run) ~= 'string' or config.run == '' then return nil, '"run" must name a run' end
    append(argv, 'attach', config.run)
    relay_options(argv, config)
    append(argv, unpack(SERVING))
    return argv
  end
  if config.request ~= 'launch' then return nil, '"request" must be "launch" or "attach"' end
  if config.rerunOf then
    append(argv, 'rerun', config.rerunOf)
    relay_options(argv, config)
    append(argv, unpack(SERVING))
    return argv
  end
  local workdir = config.workdir or cwd
  if workdir:sub(1, 1) ~= '/' then workdir = cwd .. '/' .. workdir end
  local command
  if config.command then
    command = { unpack(config.command) }
  elseif config.module then
    command = { config.python or 'python', '-m', config.module }
  elseif config.program then
    local program, why = M.relative(config.program, workdir)
    if not program then return nil, why end
    command = { config.python or 'python', program }
  else
    return nil, 'give one of "program", "module" or "command"'
  end
  append(command, unpack(config.args or {}))
  append(argv, 'debug', '--workdir', workdir)
  relay_options(argv, config)
  for _, pair in ipairs(ONE) do
    if config[pair[1]] ~= nil then append(argv, pair[2], tostring(config[pair[1]])) end
  end
  for _, pair in ipairs(MANY) do
    for _, item in ipairs(config[pair[1]] or {}) do append(argv, pair[2], item) end
  end
  local names = {}
  for name in pairs(config.env or {}) do names[#names + 1] = name end
  table.sort(names)
  for _, name in ipairs(names) do append(argv, '--env', name .. '=' .. config.env[name]) end
  append(argv, unpack(config.tetherArgs or {}))
  append(argv, unpack(SERVING))
  append(argv, '--', unpack(command))
  return argv
end

--- {run, port} from the serving command's ready line, or nil for any other line
function M.ready(line, decode)
  if line:sub(1, 1) ~= '{' then return nil end
  local ok, said = pcall(decode, line)
  if ok and type(said) == 'table' and type(said.run) == 'string' then return said end
  return nil
end

return M
