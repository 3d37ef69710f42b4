import json,re,sys,subprocess,glob,collections
getter={'Sessions':'sessions','Transcripts':'transcripts','Inbox':'inbox','Outbox':'outbox','Processes':'processes','Buttons':'buttons','Approvals':'approvals','Jobs':'jobs','AgentSessions':'agent_sessions','Generations':'generations','ChildGroups':'child_groups','FileSends':'file_sends','Users':'users','Usage':'usage'}
meth={}
for p in glob.glob('src/store/*.rs'):
    cur=None
    for line in open(p):
        m=re.match(r'impl (\w+) \{',line)
        if m: cur=m.group(1) if m.group(1) in getter else None
        if line.startswith('}'): pass
        m=re.match(r'    pub (?:async )?fn (\w+)',line)
        if m and cur:
            n=m.group(1)
            if n in meth and meth[n]!=cur: print('DUP',n,meth[n],cur,file=sys.stderr)
            meth[n]=cur
cmd=sys.argv[1:]
out=subprocess.run(cmd,capture_output=True,text=True,cwd='.').stdout
edits=collections.defaultdict(set)
for l in out.splitlines():
    try: j=json.loads(l)
    except: continue
    if j.get('reason')!='compiler-message': continue
    msg=j['message']
    if not msg.get('code') or msg['code']['code']!='E0599': continue
    m=re.match(r'no method named `(\w+)` found for (?:struct|reference) `[&]*(?:[\w:]*::)?Store`',msg['message'])
    if not m: continue
    name=m.group(1)
    if name not in meth: print('UNKNOWN',name,file=sys.stderr); continue
    for sp in msg['spans']:
        if sp['is_primary']:
            edits[sp['file_name']].add((sp['byte_start'],getter[meth[name]]))
n=0
for f,es in edits.items():
    b=open(f,'rb').read()
    for start,g in sorted(es,reverse=True):
        b=b[:start]+(g+'().').encode()+b[start:]; n+=1
    open(f,'wb').write(b)
print('edits',n)
